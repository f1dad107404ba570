import type pg from 'pg';
import { formatShardList, shardsPhrase } from '../config/ranges.js';
import type { HostConfig, ShardctlConfig } from '../config/types.js';
import { hostForShard } from '../config/types.js';
import { optionKeys, refuseUnknownOptions } from '../config/validate.js';
import { failureReason, HostError, StaleMapError, UsageError } from '../errors.js';
import { registerUrlSecret } from '../pg/redact.js';
import {
  forServerLibpq,
  formatPostgresUrl,
  isMultiHostUrl,
  parsePostgresUrl,
  serverKey,
  type PostgresUrl,
  withCredentials,
} from '../pg/multihost.js';
import { parseNumberList, simpleQuery } from './catalog.js';
import { describePgError, withHost } from './connect.js';
import type { Fleet } from './session.js';
import { quoteLiteral } from '../pg/quote.js';
import { firstSqlState } from '../pg/sqlstate.js';
import { CONTROL } from './control.js';
import { withReadHint } from './rights.js';
import { EMPTY, sql, type Sql } from '../pg/sql-template.js';

/**
 * Where the shards are, as the fleet says: no file at run time.
 *
 * Each host knows for sure which shards it holds: its `shards` rows, written in the same transaction
 * as the schema (init, add-schema) or the switch of a move (state 'active'). Those claims decide.
 * Each host also keeps a copy of the whole placement (`placement`, one row per shard with the
 * placement version of the switch that put it there) and the fleet's host registry (`hosts`): they
 * tell a reader where the shards of a host it cannot reach are, and where a shard that left a
 * reachable host went. Every switch gives its shards a version above any either host has seen, so
 * for one shard the newest copy wins; the fleet's version is the largest any host has recorded.
 */

export type ShardState = 'active' | 'fenced' | 'incoming';

/** What one host says about the fleet. */
export interface HostPlacementView {
  /** The name this host was reached under (the file's, a registry's, or a seed's label). */
  readonly reachedAs: string;
  /** Null on a host whose control schema has no fleet row yet (never initialised by this version). */
  readonly fleet: { readonly fleetId: string; readonly hostName: string; readonly version: bigint } | null;
  readonly layout: PlacementLayout | null;
  readonly registry: ReadonlyMap<string, string>;
  /** The host's copy of the placement: shard → holder and version. */
  readonly copy: ReadonlyMap<number, { readonly host: string; readonly version: bigint }>;
  /** The shards this host holds a copy of, by state. */
  readonly claims: ReadonlyMap<number, ShardState>;
  /** Shards of the unfinished moves this host records. */
  readonly moving: ReadonlySet<number>;
  /**
   * Roles other than the owner (and superusers) that can write the registry, the placement or the
   * fleet row of this host (CONTROL_WRITERS_SQL): while there is one, a router does not trust the
   * addresses this host's registry lists.
   */
  readonly registryWriters: readonly string[];
}

/**
 * Who, besides the owner of a control table and superusers, can change it: PUBLIC when it holds a
 * right that writes (INSERT, UPDATE, DELETE, TRUNCATE on the table, INSERT or UPDATE on one of its
 * columns, TRIGGER: a trigger runs its function as whoever writes the table, the owner included),
 * else every role that holds one, by a grant of its own, a column's, one it inherits
 * (pg_write_all_data included: a predefined role is named only while it has a member) or PUBLIC's; and every member, direct or not, of the role that owns
 * the table or of the one that owns the control schema (which may drop the table and make another).
 * `tables`: control table names; all tables of the control schema when omitted.
 */
export function controlWritersSql(tables?: readonly string[]): string {
  const which = tables
    ? `c.oid = ANY (ARRAY[${tables.map((t) => `${quoteLiteral(`${CONTROL}.${t}`)}::regclass`).join(', ')}])`
    : `c.relnamespace = pg_catalog.to_regnamespace(${quoteLiteral(CONTROL)}) AND c.relkind IN ('r', 'p')`;
  return `SELECT c.oid::regclass::text AS "table", w.role
   FROM pg_catalog.pg_class c
   JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
   CROSS JOIN LATERAL (
     SELECT EXISTS (
              SELECT FROM pg_catalog.aclexplode(coalesce(c.relacl, pg_catalog.acldefault('r', c.relowner))) a
               WHERE a.grantee = 0 AND a.privilege_type IN ('INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'TRIGGER'))
         OR EXISTS (
              SELECT FROM pg_catalog.pg_attribute t, pg_catalog.aclexplode(t.attacl) a
               WHERE t.attrelid = c.oid AND t.attnum > 0 AND a.grantee = 0 AND a.privilege_type IN ('INSERT', 'UPDATE'))
            AS public
   ) p
   CROSS JOIN LATERAL (
     SELECT 'PUBLIC' AS role WHERE p.public
     UNION
     SELECT r.rolname FROM pg_catalog.pg_roles r
      WHERE r.oid <> c.relowner AND NOT r.rolsuper
        -- A predefined role (pg_write_all_data) counts through its members only.
        AND (r.oid >= 16384 OR EXISTS (SELECT FROM pg_catalog.pg_auth_members m WHERE m.roleid = r.oid))
        AND ((NOT p.public
              AND (pg_catalog.has_table_privilege(r.oid, c.oid, 'INSERT, UPDATE, DELETE, TRUNCATE, TRIGGER')
                   OR pg_catalog.has_any_column_privilege(r.oid, c.oid, 'INSERT, UPDATE')))
             OR pg_catalog.pg_has_role(r.oid, c.relowner, 'MEMBER')
             OR (n.nspowner <> c.relowner AND pg_catalog.pg_has_role(r.oid, n.nspowner, 'MEMBER')))
   ) w
  WHERE ${which}
  ORDER BY 1, 2`;
}

/** The control tables whose contents a router acts on when it is opened from seeds. */
const REGISTRY_TABLES = ['hosts', 'placement', 'fleet'] as const;

export interface PlacementLayout {
  readonly schemaPrefix: string;
  readonly shardCount: number;
  readonly epochMs: bigint;
  readonly shardBits: number;
  readonly sequenceBits: number;
}

/** The fleet's placement, merged from every host that answered. */
export interface FleetPlacement {
  readonly fleetId: string | null;
  /** The newest placement version any host answered with. */
  readonly version: bigint;
  readonly layout: PlacementLayout | null;
  /** Host name → address (no credentials), from the registries. */
  readonly hosts: ReadonlyMap<string, string>;
  /** Shard → the host that holds it now (mid-cut-over: the fenced source, until the switch). */
  readonly owners: ReadonlyMap<number, string>;
  /** The hosts that answered, by the name the fleet knows them. */
  readonly answered: readonly string[];
  /** Contradictions between hosts (two claim the same shard, two fleet ids); empty normally. */
  readonly problems: readonly string[];
  /** What each host said. */
  readonly views: readonly HostPlacementView[];
  /** Shards in unfinished moves: their switch rewrites the operator's file wave by wave. */
  readonly moving: ReadonlySet<number>;
}

/**
 * One round trip: the fleet row, the layout, the registry, the placement copy (grouped by holder
 * and version) and this host's own shards (grouped by state). A host whose control schema predates
 * the fleet tables, or has none, answers with what it has.
 */
export async function readPlacementView(
  client: pg.Client | pg.PoolClient,
  reachedAs: string,
): Promise<HostPlacementView> {
  const core = [
    `SELECT schema_prefix, shard_count, epoch_ms::text AS epoch_ms, shard_bits, sequence_bits FROM ${CONTROL}.layout`,
    `SELECT state, string_agg(shard::text, ',' ORDER BY shard) AS shards FROM ${CONTROL}.shards GROUP BY state`,
    `SELECT string_agg(s::text, ',') AS shards FROM ${CONTROL}.moves, unnest(shards) AS s WHERE status = 'running'`,
  ];
  const fleetQueries = [
    `SELECT fleet_id::text AS fleet_id, host_name, placement_version::text AS version FROM ${CONTROL}.fleet`,
    `SELECT name, address FROM ${CONTROL}.hosts ORDER BY name`,
    `SELECT host, version::text AS version, string_agg(shard::text, ',' ORDER BY shard) AS shards FROM ${CONTROL}.placement GROUP BY host, version`,
    controlWritersSql(REGISTRY_TABLES),
  ];
  let rows: unknown[][];
  try {
    // One round trip on a host of this version (the common case). The statements only read: a
    // failing one aborts the implicit transaction of the batch and leaves nothing open.
    rows = await simpleQuery(client, [...core, ...fleetQueries]);
  } catch (error) {
    if ((error as { code?: string }).code !== '42P01') throw error;
    // A fresh host (no control schema) or one whose control schema predates the fleet tables.
    const [tables] = await simpleQuery(client, [
      `SELECT to_regclass(${quoteLiteral(`${CONTROL}.shards`)}) IS NOT NULL AS shards, to_regclass(${quoteLiteral(`${CONTROL}.fleet`)}) IS NOT NULL AS fleet`,
    ]);
    const { shards, fleet } = tables![0] as { shards: boolean; fleet: boolean };
    if (!shards)
      return {
        reachedAs,
        fleet: null,
        layout: null,
        registry: new Map(),
        copy: new Map(),
        claims: new Map(),
        moving: new Set(),
        registryWriters: [],
      };
    rows = await simpleQuery(client, [...core, ...(fleet ? fleetQueries : [])]);
  }
  const [layoutRows, claimRows, movingRows, fleetRows, hostRows, copyRows, writerRows] = rows;
  const layoutRow = layoutRows![0] as
    | { schema_prefix: string; shard_count: number; epoch_ms: string; shard_bits: number; sequence_bits: number }
    | undefined;
  const fleetRow = (fleetRows ?? [])[0] as { fleet_id: string; host_name: string; version: string } | undefined;
  const claims = new Map<number, ShardState>();
  for (const row of claimRows as { state: ShardState; shards: string }[])
    for (const shard of parseNumberList(row.shards)) claims.set(shard, row.state);
  const copy = new Map<number, { host: string; version: bigint }>();
  for (const row of (copyRows ?? []) as { host: string; version: string; shards: string }[]) {
    const entry = { host: row.host, version: BigInt(row.version) };
    for (const shard of parseNumberList(row.shards)) copy.set(shard, entry);
  }
  return {
    reachedAs,
    fleet: fleetRow
      ? { fleetId: fleetRow.fleet_id, hostName: fleetRow.host_name, version: BigInt(fleetRow.version) }
      : null,
    layout: layoutRow
      ? {
          schemaPrefix: layoutRow.schema_prefix,
          shardCount: layoutRow.shard_count,
          epochMs: BigInt(layoutRow.epoch_ms),
          shardBits: layoutRow.shard_bits,
          sequenceBits: layoutRow.sequence_bits,
        }
      : null,
    registry: new Map(((hostRows ?? []) as { name: string; address: string }[]).map((r) => [r.name, r.address])),
    copy,
    claims,
    moving: new Set(parseNumberList((movingRows![0] as { shards: string | null } | undefined)?.shards ?? '')),
    registryWriters: [...new Set(((writerRows ?? []) as { role: string }[]).map((r) => r.role))],
  };
}

/**
 * Merges what the hosts said. Per shard: the one host that holds it active; else, when a host holds
 * it fenced, the newer holder its placement copies name (the switch happened on a host not read),
 * or that host itself (a move between fence and switch); else the newest copy's holder.
 */
export function mergePlacement(views: readonly HostPlacementView[]): FleetPlacement {
  const problems: string[] = [];
  const nameOf = (view: HostPlacementView): string => view.fleet?.hostName ?? view.reachedAs;
  const fleetIds = [...new Set(views.flatMap((v) => (v.fleet ? [v.fleet.fleetId] : [])))];
  if (fleetIds.length > 1) {
    problems.push(
      `hosts of different fleets: ${fleetIds
        .map(
          (id) =>
            `${id} (${views
              .filter((v) => v.fleet?.fleetId === id)
              .map(nameOf)
              .join(', ')})`,
        )
        .join(' and ')}`,
    );
  }
  let version = 0n;
  for (const view of views) if (view.fleet && view.fleet.version > version) version = view.fleet.version;

  // Registries: the one of the host with the newest placement wins a name's address.
  const hosts = new Map<string, string>();
  for (const view of [...views].sort((a, b) => ((a.fleet?.version ?? -1n) < (b.fleet?.version ?? -1n) ? -1 : 1))) {
    for (const [name, address] of view.registry) hosts.set(name, address);
  }

  const newest = new Map<number, { host: string; version: bigint }>();
  for (const view of views) {
    for (const [shard, entry] of view.copy) {
      const known = newest.get(shard);
      if (!known || entry.version > known.version) newest.set(shard, entry);
    }
  }
  const active = new Map<number, string[]>();
  const fenced = new Map<number, string[]>();
  const add = (claims: Map<number, string[]>, shard: number, host: string): void => {
    const list = claims.get(shard);
    if (list) list.push(host);
    else claims.set(shard, [host]);
  };
  for (const view of views) {
    for (const [shard, state] of view.claims) {
      if (state === 'active') add(active, shard, nameOf(view));
      else if (state === 'fenced') add(fenced, shard, nameOf(view));
    }
  }
  const owners = new Map<number, string>();
  const doubled: number[] = [];
  for (const [shard, holders] of active) {
    if (holders.length > 1) doubled.push(shard);
    const copy = newest.get(shard);
    owners.set(shard, holders.length > 1 && copy && holders.includes(copy.host) ? copy.host : holders[0]!);
  }
  if (doubled.length > 0) {
    const one = doubled.length === 1;
    problems.push(
      `${one ? 'shard' : 'shards'} ${formatShardList(doubled.sort((a, b) => a - b))} ${one ? 'is' : 'are'} active on more than one host`,
    );
  }
  // A shard no host holds active: it is fenced where it lives (a move between its fence and its
  // switch), and may also be fenced on hosts it left earlier (old copies waiting for gc). Its owner
  // is the fenced copy the newest placement names; else, when that host answered without it, the
  // host it names (the copy was dropped); else the one fenced copy.
  for (const [shard, hosts] of fenced) {
    if (owners.has(shard)) continue;
    const copy = newest.get(shard);
    if (copy && hosts.includes(copy.host)) owners.set(shard, copy.host);
    else owners.set(shard, copy && answeredNot(views, copy.host, nameOf) ? copy.host : hosts[0]!);
  }
  for (const [shard, copy] of newest) {
    if (owners.has(shard)) continue;
    // A reachable host that the copy names but that does not hold the shard: nobody has it (dropped).
    if (answeredNot(views, copy.host, nameOf)) owners.set(shard, copy.host);
  }
  const layout = views.find((v) => v.layout)?.layout ?? null;
  return {
    fleetId: fleetIds[0] ?? null,
    version,
    layout,
    hosts,
    owners,
    answered: views.map(nameOf),
    problems,
    views,
    moving: new Set(views.flatMap((v) => [...v.moving])),
  };
}

function answeredNot(
  views: readonly HostPlacementView[],
  host: string,
  nameOf: (view: HostPlacementView) => string,
): boolean {
  return !views.some((v) => nameOf(v) === host);
}

/** A place where the file and the fleet disagree: these shards are on `fleetHost`, the file says `fileHost`. */
export interface MapDisagreement {
  readonly shards: readonly number[];
  /** Null: the file does not map them (shards beyond its count). */
  readonly fileHost: string | null;
  /** The host holding them now, as the fleet says. */
  readonly fleetHost: string;
  /** The fleet host is not in the file at all. */
  readonly unknownHost: boolean;
}

/**
 * Shards the fleet places somewhere else than the file, grouped by (file host, fleet host). Shards
 * the fleet knows nothing about (no host answered for them) are not disagreements.
 */
export function mapDisagreements(
  config: Pick<ShardctlConfig, 'hosts' | 'shards' | 'schemaPrefix'>,
  placement: FleetPlacement,
  ignore: ReadonlySet<number> = new Set(),
): MapDisagreement[] {
  // A file of another layout is refused for that (layout checks name it); shard by shard it means nothing.
  const layout = placement.layout;
  if (layout && (layout.schemaPrefix !== config.schemaPrefix || layout.shardCount !== config.shards)) return [];
  const groups = new Map<string, { fileHost: string | null; fleetHost: string; shards: number[] }>();
  for (const [shard, fleetHost] of [...placement.owners].sort((a, b) => a[0] - b[0])) {
    if (ignore.has(shard)) continue;
    const fileHost = shard < config.shards ? (hostForShard(config as ShardctlConfig, shard)?.name ?? null) : null;
    if (fileHost === fleetHost) continue;
    const key = `${fileHost ?? ''}\u0000${fleetHost}`;
    let group = groups.get(key);
    if (!group) groups.set(key, (group = { fileHost, fleetHost, shards: [] }));
    group.shards.push(shard);
  }
  return [...groups.values()].map((g) => ({ ...g, unknownHost: !config.hosts.some((h) => h.name === g.fleetHost) }));
}

/** One line per disagreement: "shards 3-5: the file says pg1, the fleet says pg2 (placement version 7)". */
export function describeDisagreements(disagreements: readonly MapDisagreement[]): string[] {
  return disagreements.map(
    (d) =>
      `${shardsPhrase(d.shards)}: the file says ${d.fileHost ?? 'nothing'}, ` +
      `the fleet says ${d.fleetHost}${d.unknownHost ? ' (a host the file does not list)' : ''}`,
  );
}

/**
 * A connection URL without user and password (and without a password parameter): what the
 * registry stores, so that every reader connects with its own credentials. Null for a string that
 * is not a URL.
 */
export function hostAddress(url: string): string | null {
  if (isMultiHostUrl(url)) {
    let multi: PostgresUrl;
    try {
      multi = parsePostgresUrl(url);
    } catch {
      return null;
    }
    const params = new URLSearchParams(multi.query.slice(1));
    for (const key of [...params.keys()]) if (/^(ssl)?password$|^user$/i.test(key)) params.delete(key);
    const query = params.toString();
    return formatPostgresUrl({ ...multi, userinfo: undefined, query: query ? `?${query}` : '' });
  }
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    return null;
  }
  parsed.username = '';
  parsed.password = '';
  for (const key of [...parsed.searchParams.keys()]) {
    if (/^(ssl)?password$|^user$/i.test(key)) parsed.searchParams.delete(key);
  }
  return parsed.toString();
}

/**
 * Records, in one transaction, the fleet id and this host's name, the registry, and the placement
 * copy for `owners` at `version` (rows with a newer version are kept).
 */
export function registerFleetSql(input: {
  fleetId: string;
  hostName: string;
  registry: readonly { name: string; address: string }[];
  owners: ReadonlyMap<number, string>;
  version: bigint;
}): string {
  const byHost = new Map<string, number[]>();
  for (const [shard, host] of input.owners) {
    const list = byHost.get(host);
    if (list) list.push(shard);
    else byHost.set(host, [shard]);
  }
  const version = input.version.toString();
  return [
    'BEGIN;',
    `INSERT INTO ${CONTROL}.fleet (fleet_id, host_name, placement_version) VALUES (${quoteLiteral(input.fleetId)}, ${quoteLiteral(input.hostName)}, ${version})`,
    `  ON CONFLICT (singleton) DO UPDATE SET host_name = EXCLUDED.host_name, placement_version = greatest(${CONTROL}.fleet.placement_version, EXCLUDED.placement_version);`,
    ...input.registry.map(
      (h) =>
        `INSERT INTO ${CONTROL}.hosts (name, address) VALUES (${quoteLiteral(h.name)}, ${quoteLiteral(h.address)}) ON CONFLICT (name) DO UPDATE SET address = EXCLUDED.address;`,
    ),
    ...[...byHost].map(
      ([host, shards]) =>
        `INSERT INTO ${CONTROL}.placement (shard, host, version) SELECT s, ${quoteLiteral(host)}, ${version} FROM unnest(${intArray(shards)}) AS s\n` +
        `  ON CONFLICT (shard) DO UPDATE SET host = EXCLUDED.host, version = EXCLUDED.version WHERE ${CONTROL}.placement.version < EXCLUDED.version;`,
    ),
    'COMMIT;',
  ].join('\n');
}

/**
 * The placement version a host has seen for some shards: the greater of the fleet's version and
 * the versions of those shards' placement rows (`where` picks them), and of `atLeast` when given.
 * A switch places its shards one above it (switchPlacementSql); a move reads it once fenced.
 */
export function placementVersionSql(where: Sql, atLeast?: Sql): Sql {
  return sql`greatest(coalesce((SELECT placement_version FROM ${CONTROL}.fleet), 0), coalesce((SELECT max(version) FROM ${CONTROL}.placement WHERE ${where}), 0)${atLeast === undefined ? EMPTY : sql`, ${atLeast}`})`;
}

/**
 * The switch of a move on one host, one statement (one round trip, inside the window where writes
 * are blocked): on the target, `activate` makes its copies active; on both, the placement copy says
 * `target` at a version above any this host has seen and at least `atLeast`. Returns the version.
 */
export function switchPlacementSql(activate: boolean): string {
  return `WITH activated AS (
    ${activate ? `UPDATE ${CONTROL}.shards SET state = 'active' WHERE shard = ANY($1::int[]) RETURNING shard` : 'SELECT NULL::int AS shard WHERE false'}
  ), next AS (
    SELECT ${placementVersionSql(sql`shard = ANY($1::int[])`, sql`$3::bigint - 1`)} + 1 AS version
  ), placed AS (
    INSERT INTO ${CONTROL}.placement (shard, host, version) SELECT s, $2, next.version FROM unnest($1::int[]) AS s, next
    ON CONFLICT (shard) DO UPDATE SET host = EXCLUDED.host, version = EXCLUDED.version
    RETURNING version
  ), bumped AS (
    UPDATE ${CONTROL}.fleet SET placement_version = greatest(placement_version, (SELECT version FROM next)) RETURNING placement_version
  )
  SELECT (SELECT version FROM next)::text AS version, (SELECT count(*) FROM activated) AS activated, (SELECT count(*) FROM placed) AS placed, (SELECT count(*) FROM bumped) AS bumped`;
}

/** The hosts of a config as registry entries (hosts whose URL is not a URL are left out). */
export function registryOf(hosts: readonly HostConfig[]): { name: string; address: string }[] {
  return hosts.flatMap((h) => {
    const address = hostAddress(h.url);
    return address ? [{ name: h.name, address }] : [];
  });
}

function intArray(values: readonly number[]): string {
  return `'{${values.join(',')}}'::int[]`;
}

/**
 * The placement as the reachable hosts of a run say it (one round trip per host, in parallel); a
 * host that cannot be read (a role that may not read the control schema, a host that stopped
 * answering) stops it, named.
 */
export async function readFleetPlacement(fleet: Fleet): Promise<FleetPlacement> {
  return mergePlacement(
    await fleet.each((s) => readPlacementView(s.client, s.host.name), { doing: "cannot read the fleet's placement" }),
  );
}

/**
 * Takes the runner locks (Fleet.lock) and returns the placement read just before asking for them,
 * for requireCurrentMapLocked to see whether the fleet moved on while the run waited. Undefined
 * when a host refuses that read for want of rights (a role without rights on the control schema,
 * SQLSTATE 42501): the lock, taken next, says why in its own words. Any other failure of the read
 * is the host's, as the lock would meet it: the host is lost (`tolerateLoss`) or the failure
 * thrown, naming the host.
 */
export async function lockAfterPlacement(
  fleet: Fleet,
  options: { lockTimeout?: string; tolerateLoss?: boolean } = {},
): Promise<FleetPlacement | undefined> {
  let refused = false;
  const views = await fleet.each(
    async (s) => {
      try {
        return await readPlacementView(s.client, s.host.name);
      } catch (error) {
        if ((error as { code?: unknown } | null)?.code !== '42501') throw error;
        refused = true;
        return null;
      }
    },
    { tolerateLoss: options.tolerateLoss ?? false, doing: "cannot read the fleet's placement" },
  );
  await fleet.lock(options);
  return refused ? undefined : mergePlacement(views.filter((v) => v !== null));
}

/**
 * The file's hosts whose url reached a server that is another host of the fleet (its control
 * schema records that name): two urls swapped, or one copied from another host.
 */
export function misaddressedHosts(
  config: Pick<ShardctlConfig, 'hosts'>,
  placement: Pick<FleetPlacement, 'views'>,
): { name: string; reached: string }[] {
  return placement.views.flatMap((view) =>
    view.fleet && view.fleet.hostName !== view.reachedAs && config.hosts.some((h) => h.name === view.reachedAs)
      ? [{ name: view.reachedAs, reached: view.fleet.hostName }]
      : [],
  );
}

/**
 * Refuses (UsageError, exit 2) a file whose url for a host reaches another host of the fleet, and
 * (StaleMapError, exit 2) when the file places any shard elsewhere than the fleet, except
 * the shards of unfinished moves (their switch rewrites the file wave by wave), or when the hosts
 * belong to different fleets.
 */
export function requireCurrentMap(config: ShardctlConfig, placement: FleetPlacement): void {
  const [wrong] = misaddressedHosts(config, placement);
  if (wrong) {
    const index = config.hosts.findIndex((h) => h.name === wrong.name);
    throw new UsageError(
      `reaches host ${wrong.reached} of the fleet (its control schema says so), not ${wrong.name}: each host's url must reach that host (shardctl map show lists the fleet's hosts and their addresses); nothing was written`,
      {
        input: `hosts[${index}].url (host ${wrong.name}) in ${config.file}`,
        data: { host: wrong.name, reached: wrong.reached },
      },
    );
  }
  const disagreements = mapDisagreements(config, placement, placement.moving);
  const mixed = placement.problems.filter((p) => p.startsWith('hosts of different fleets'));
  if (disagreements.length === 0 && mixed.length === 0) return;
  throw staleMapError(config.file, mixed, disagreements, placement);
}

/** The StaleMapError of `disagreements` (after the lines of `first`), with their data. */
export function staleMapError(
  file: string,
  first: readonly string[],
  disagreements: readonly MapDisagreement[],
  placement: Pick<FleetPlacement, 'version'>,
): StaleMapError {
  return new StaleMapError(file, [...first, ...describeDisagreements(disagreements)], {
    placementVersion: placement.version.toString(),
    disagreements: disagreements.map((d) => ({
      shards: formatShardList(d.shards),
      file: d.fileHost,
      fleet: d.fleetHost,
    })),
  });
}

/**
 * `config` with each of its hosts' shard lists as the fleet places them now (`placement`), every
 * other setting as given: for a run that moves shards one batch after another and needs the map
 * between them, without reading its file again (that would take the file's addresses and
 * credentials in place of ones the caller set in code, and `${VAR}`s from another environment).
 * A shard placed on a host the config does not name, or on none, stays where the config has it
 * (the next move's check against the fleet refuses such a map, naming it).
 */
export function withFleetShardLists(config: ShardctlConfig, placement: FleetPlacement): ShardctlConfig {
  const names = config.hosts.map((h) => h.name);
  const known = new Set(names);
  const byHost = shardsByHost(
    shardOwners(config.hosts, placement, config.shards, (h) => known.has(h)),
    names,
  );
  return {
    ...config,
    hosts: config.hosts.map((h) => {
      const shards = byHost.get(h.name)!;
      return { ...h, shards, shardsSpec: shards.length === 0 ? '' : formatShardList(shards) };
    }),
  };
}

/**
 * Each shard's host: where `hosts` list it, unless the fleet places it (a shard below `shardCount`)
 * on a host that `known` accepts (default: any).
 */
function shardOwners(
  hosts: readonly HostConfig[],
  placement: Pick<FleetPlacement, 'owners'>,
  shardCount: number,
  known: (host: string) => boolean = () => true,
): Map<number, string> {
  const owner = new Map<number, string>();
  for (const host of hosts) for (const shard of host.shards) owner.set(shard, host.name);
  for (const [shard, host] of placement.owners) if (shard < shardCount && known(host)) owner.set(shard, host);
  return owner;
}

/** The shards of each of `names` (which name every owner), in order. */
function shardsByHost(owner: ReadonlyMap<number, string>, names: readonly string[]): Map<string, number[]> {
  const byHost = new Map<string, number[]>(names.map((n) => [n, []]));
  for (const [shard, host] of [...owner].sort((a, b) => a[0] - b[0])) byHost.get(host)!.push(shard);
  return byHost;
}

/**
 * requireCurrentMap for a run that has just taken the runner locks, and the config it goes on with.
 * A run that waited for them behind a move read its map before the move's switch changed the fleet.
 * Two ways to tell, tried in order; every setting but the hosts' shard lists stays as given:
 *  - `before`, the placement read just before the run asked for the locks: when the config agreed
 *    with it and the fleet has moved on since (its version), the disagreement is what finished
 *    while the run waited, and the shard lists are taken from the fleet (withFleetShardLists). The
 *    file is not read: a config whose addresses or credentials were set in code, or loaded with an
 *    environment of the caller's own, is used as given. (Not when the fleet placed a shard on a host
 *    the config does not name: a rebalance onto a host added to the file.)
 *  - otherwise the file is read again (`reload`): the file on disk agrees with the fleet where the
 *    copy read at the start does not when the move rewrote it. Its shard lists are taken only when
 *    it names the same hosts at the same urls (anything else was edited by hand: refused as before).
 */
export async function requireCurrentMapLocked(
  config: ShardctlConfig,
  placement: FleetPlacement,
  reload: (file: string) => Promise<ShardctlConfig>,
  before?: FleetPlacement,
): Promise<ShardctlConfig> {
  try {
    requireCurrentMap(config, placement);
    return config;
  } catch (error) {
    if (!(error instanceof StaleMapError)) throw error;
    if (before && before.version !== placement.version && agrees(config, before)) {
      const current = withFleetShardLists(config, placement);
      // Unless the fleet placed a shard on a host the config does not name: the file may (below).
      if (agrees(current, placement)) return current;
    }
    if (config.file === '<inline>') throw error;
    const again = await reload(config.file).catch(() => null);
    const same =
      again !== null &&
      again.hosts.length === config.hosts.length &&
      again.hosts.every((h, i) => h.name === config.hosts[i]!.name && h.url === config.hosts[i]!.url);
    if (!same) throw error;
    const current: ShardctlConfig = {
      ...config,
      hosts: config.hosts.map((h, i) => ({
        ...h,
        shards: again.hosts[i]!.shards,
        shardsSpec: again.hosts[i]!.shardsSpec,
      })),
    };
    // Still stale: the refusal as the file reads now.
    requireCurrentMap(current, placement);
    return current;
  }
}

/** Whether requireCurrentMap accepts `config` against `placement`. */
function agrees(config: ShardctlConfig, placement: FleetPlacement): boolean {
  try {
    requireCurrentMap(config, placement);
    return true;
  } catch {
    return false;
  }
}

/**
 * What init and add-schema record on every host they ran on: the fleet id (the fleet's, or a new
 * one on a fleet that has none), the registry (the file's hosts), and the placement copy of the
 * file's map, which the run has just made true. The version moves on only when some host's record
 * differs from that.
 */
export function fleetRecord(
  config: ShardctlConfig,
  placement: FleetPlacement,
  newFleetId: () => string,
): { fleetId: string; registry: { name: string; address: string }[]; owners: Map<number, string>; version: bigint } {
  const owners = new Map<number, string>();
  for (const host of config.hosts) for (const shard of host.shards) owners.set(shard, host.name);
  const registry = registryOf(config.hosts);
  const current =
    placement.views.length > 0 &&
    placement.views.every(
      (view) =>
        view.fleet !== null &&
        registry.every((h) => view.registry.get(h.name) === h.address) &&
        [...owners].every(([shard, host]) => view.copy.get(shard)?.host === host),
    );
  return {
    fleetId: placement.fleetId ?? newFleetId(),
    registry,
    owners,
    version: current ? placement.version : placement.version + 1n,
  };
}

/** The hosts read, and those that could not be. */
export interface Discovery {
  readonly placement: FleetPlacement;
  readonly unreachable: readonly UnreachableHost[];
}

/** A host a discovery could not read, and why. */
export interface UnreachableHost {
  readonly name: string;
  readonly reason: string;
  /**
   * It could not be connected to at all (no answer within the timeout, refused, no such name), as
   * opposed to a server that answered with an error (a role or password refused, a missing grant).
   */
  readonly connectFailed?: boolean;
  /**
   * With connectFailed: how long the failed connect took (ms). Near the host's timeout for a host
   * that did not answer at all; a few ms for one that refused, which may be back a moment later.
   */
  readonly connectWaitedMs?: number;
}

/** For commands that change the fleet: refuses a file that disagrees with the hosts that answer. */
export async function requireFleetAgrees(config: ShardctlConfig, applicationName?: string): Promise<FleetPlacement> {
  const { placement } = await discoverFromConfig(config, applicationName ? { applicationName } : {});
  requireCurrentMap(config, placement);
  return placement;
}

/** A discovery that also knows how to reach each host (URLs with credentials: secrets). */
export interface FleetDiscovery extends Discovery {
  readonly urls: ReadonlyMap<string, string>;
  /**
   * Every host the trusted registries list, at its registry address with the credentials of the
   * discovery (a router's way to a host whose own URL no longer leads to its primary).
   */
  readonly registryUrls?: ReadonlyMap<string, string>;
  /** Hosts whose registry roles other than its owner can write: the addresses it lists were not used. */
  readonly distrusted: readonly { readonly name: string; readonly writers: readonly string[] }[];
}

/** How long discovery waits for a host that does not answer, unless the config says (hostTimeout). */
export const DISCOVERY_TIMEOUT_MS = 10_000;

function discoveryHost(
  target: { name: string; url: string; timeoutMs?: number },
  timeoutMs: number | undefined,
): HostConfig {
  return {
    name: target.name,
    url: target.url,
    directUrl: target.url,
    replicationUrl: target.url,
    shardsSpec: '',
    shards: [],
    weight: 1,
    drain: false,
    timeoutMs: target.timeoutMs ?? timeoutMs ?? DISCOVERY_TIMEOUT_MS,
  };
}

export interface DiscoverFleetOptions {
  readonly applicationName?: string;
  /** A URL whose user and password reach hosts the seeds' registries name. */
  readonly credentials?: string;
  readonly connectTimeoutMs?: number;
  /** Ends the reading at once when aborted: every host not read by then fails (a router closed meanwhile). */
  readonly signal?: AbortSignal;
}
const DISCOVER_FLEET_KEYS = optionKeys<DiscoverFleetOptions>({
  applicationName: true,
  credentials: true,
  connectTimeoutMs: true,
  signal: true,
});

/**
 * Discovery from seeds: reads the seeds, then every host their registries name (reached at its
 * address with `credentials`' user and password, else the PG* environment and ~/.pgpass), in two
 * rounds of parallel reads. The fleet is the first answering seed's: a host of another fleet is
 * reported, never read into the placement.
 */
export async function discoverFleet(
  seeds: readonly { name: string; url: string; timeoutMs?: number }[],
  options: DiscoverFleetOptions = {},
): Promise<FleetDiscovery> {
  refuseUnknownOptions('discoverFleet options', options, DISCOVER_FLEET_KEYS);
  const urls = new Map<string, string>();
  const accepted: HostPlacementView[] = [];
  const unreachable: UnreachableHost[] = [];
  const distrusted: { name: string; writers: readonly string[] }[] = [];
  let fleetId: string | null = null;
  // Servers a seed could not even connect to (no answer, refused): a registry address naming the
  // same server is not tried a second time (another connect timeout) but reported with that reason.
  const deadServers = new Map<string, { reason: string; connectWaitedMs: number }>();
  const read = async (targets: readonly { name: string; url: string }[]): Promise<void> => {
    const waited: number[] = [];
    const results = await Promise.allSettled(
      targets.map((t, i) => {
        const started = performance.now();
        return withHost(discoveryHost(t, options.connectTimeoutMs), (client) => readPlacementView(client, t.name), {
          applicationName: options.applicationName ?? 'shardctl',
          ...(options.signal ? { signal: options.signal } : {}),
        }).finally(() => {
          waited[i] = Math.round(performance.now() - started);
        });
      }),
    );
    results.forEach((result, i) => {
      const target = targets[i]!;
      if (result.status === 'rejected') {
        const reason = withReadHint(failureReason(result.reason, describePgError), result.reason, target.url);
        if (!isConnectFailure(result.reason)) {
          unreachable.push({ name: target.name, reason });
          return;
        }
        const connectWaitedMs = waited[i] ?? 0;
        unreachable.push({ name: target.name, reason, connectFailed: true, connectWaitedMs });
        const server = serverKey(target.url);
        if (server !== undefined) deadServers.set(server, { reason, connectWaitedMs });
        return;
      }
      const view = result.value;
      const name = view.fleet?.hostName ?? target.name;
      if (view.fleet) {
        fleetId ??= view.fleet.fleetId;
        if (view.fleet.fleetId !== fleetId) {
          unreachable.push({ name, reason: `belongs to fleet ${view.fleet.fleetId}, not ${fleetId}; left out` });
          return;
        }
      }
      if (accepted.some((v) => (v.fleet?.hostName ?? v.reachedAs) === name)) return;
      urls.set(name, target.url);
      accepted.push(view);
    });
  };
  await read(seeds);
  const credentials = options.credentials ?? seeds[0]?.url;
  // The seed's credentials go only to addresses from registries no one but their owner can write:
  // a role that could rewrite an address would otherwise receive them (docs: README, Roles).
  const trusted = (): HostPlacementView[] => accepted.filter((v) => v.registryWriters.length === 0);
  for (const view of accepted)
    if (view.registryWriters.length > 0)
      distrusted.push({ name: view.fleet?.hostName ?? view.reachedAs, writers: view.registryWriters });
  const registry = mergePlacement(trusted()).hosts;
  const next = [...registry]
    .filter(([name]) => !urls.has(name) && !unreachable.some((u) => u.name === name))
    .map(([name, address]) => ({ name, url: withCredentials(address, credentials) }))
    .filter(({ name, url }) => {
      const dead = deadServers.get(serverKey(url) ?? '');
      if (dead !== undefined) unreachable.push({ name, ...dead, connectFailed: true });
      return dead === undefined;
    });
  if (next.length > 0) await read(next);
  const registryUrls = new Map<string, string>();
  for (const [name, address] of mergePlacement(trusted()).hosts) {
    registryUrls.set(name, withCredentials(address, credentials));
    if (!urls.has(name)) urls.set(name, withCredentials(address, credentials));
  }
  // A seed that answered under its registry name is not also unreachable under its label.
  const placement = mergePlacement(accepted);
  return {
    placement,
    unreachable: unreachable.filter((u) => !placement.answered.includes(u.name)),
    urls,
    registryUrls,
    distrusted,
  };
}

/**
 * A failure to connect at all (no answer within the timeout, refused, no such name), as opposed to
 * one the server answered (a role or password refused, a database missing: a SQLSTATE), which other
 * credentials might not meet.
 */
function isConnectFailure(error: unknown): boolean {
  return error instanceof HostError && error.code === 'HOST_UNREACHABLE' && firstSqlState(error.cause) === undefined;
}

/** A config with no hosts: a seed router's, until its first discovery fills it in. */
export function emptyFleetConfig(): ShardctlConfig {
  return {
    file: '<fleet>',
    schemaPrefix: 'insta',
    shards: 0,
    idLayout: { epochMs: 0n, shardBits: 13, sequenceBits: 10 },
    epochIso: new Date(0).toISOString(),
    migrationsDir: '',
    hosts: [],
    concurrency: 1,
    lockTimeout: '5s',
    hostTimeout: `${DISCOVERY_TIMEOUT_MS}ms`,
    warnings: [],
  };
}

/**
 * The map a router uses: the fleet's placement, with the file's layout and URLs where there is a
 * file; shards no reachable host places keep the file's host. Every host of the registry is in it.
 */
export function fleetConfig(file: ShardctlConfig | null, found: FleetDiscovery): ShardctlConfig {
  const { placement, urls } = found;
  const layout = placement.layout;
  if (!file && !layout) {
    throw new HostError(
      placement.answered.join(', '),
      'no shardctl control schema on the seeds (initialise the fleet first)',
      { code: 'NOT_A_FLEET', next: [{ action: 'init' }] },
    );
  }
  const base: ShardctlConfig = file ?? {
    ...emptyFleetConfig(),
    file: '<fleet>',
    schemaPrefix: layout!.schemaPrefix,
    shards: layout!.shardCount,
    idLayout: { epochMs: layout!.epochMs, shardBits: layout!.shardBits, sequenceBits: layout!.sequenceBits },
    epochIso: new Date(Number(layout!.epochMs)).toISOString(),
  };
  const owner = shardOwners(file?.hosts ?? [], placement, base.shards);
  const names = [
    ...new Set([
      ...(file?.hosts.map((h) => h.name) ?? []),
      ...placement.hosts.keys(),
      ...urls.keys(),
      ...owner.values(),
    ]),
  ];
  const byHost = shardsByHost(owner, names);
  // A file host whose url reached another host of the fleet: routed by what answered as it (the
  // url that reached it, if one did), never to the other host.
  const misaddressed = new Set(file ? misaddressedHosts(file, placement).map((m) => m.name) : []);
  const hosts: HostConfig[] = names.flatMap((name) => {
    const listed = file?.hosts.find((h) => h.name === name);
    const fromFile = listed && misaddressed.has(name) ? undefined : listed;
    const url = fromFile?.url ?? urls.get(name);
    if (url === undefined && byHost.get(name)!.length === 0) return [];
    registerUrlSecret(url ?? '');
    return [
      {
        name,
        // A host of the placement that no registry reached: its calls fail naming it.
        url: url ?? `postgres://unknown-address-of-${name}/`,
        directUrl: fromFile?.directUrl ?? url ?? `postgres://unknown-address-of-${name}/`,
        replicationUrl: fromFile?.replicationUrl ?? forServerLibpq(fromFile?.directUrl ?? url ?? ''),
        shardsSpec: '',
        shards: byHost.get(name)!,
        weight: fromFile?.weight ?? 1,
        drain: fromFile?.drain ?? false,
        timeoutMs: fromFile?.timeoutMs ?? file?.hosts[0]?.timeoutMs ?? DISCOVERY_TIMEOUT_MS,
      },
    ];
  });
  return { ...base, hosts };
}

/**
 * The config's map corrected by the fleet: what exec, psql and decode route by. Reads every host
 * of the file (and of the registries); the hosts that could not be read are listed.
 */
export async function currentMap(
  config: ShardctlConfig,
  applicationName = 'shardctl',
  { waitMs }: { readonly waitMs?: number } = {},
): Promise<{ config: ShardctlConfig; discovery: FleetDiscovery }> {
  const discovery = await discoverFromConfig(config, { applicationName, ...(waitMs ? { waitMs } : {}) });
  return { config: fleetConfig(config, discovery), discovery };
}

/**
 * Discovery from a config: its hosts are the seeds, each with its own URL and hostTimeout; a host
 * the registries name and the file lacks is reached with the credentials of the file's first host.
 */
export function discoverFromConfig(
  config: ShardctlConfig,
  options: {
    applicationName?: string;
    connectTimeoutMs?: number;
    /** At most this long for each host, whatever its hostTimeout (a command that can do without the fleet's word). */
    waitMs?: number;
    /** See DiscoverFleetOptions. */
    signal?: AbortSignal;
  } = {},
): Promise<FleetDiscovery> {
  const first = config.hosts[0];
  const cap = (ms: number | undefined): number | undefined =>
    options.waitMs === undefined ? ms : Math.min(ms ?? DISCOVERY_TIMEOUT_MS, options.waitMs);
  return discoverFleet(
    config.hosts.map((h) => ({ name: h.name, url: h.url, timeoutMs: cap(h.timeoutMs) })),
    {
      ...(options.applicationName ? { applicationName: options.applicationName } : {}),
      ...(first ? { credentials: first.url } : {}),
      ...(options.signal ? { signal: options.signal } : {}),
      ...(cap(options.connectTimeoutMs ?? first?.timeoutMs)
        ? { connectTimeoutMs: cap(options.connectTimeoutMs ?? first?.timeoutMs)! }
        : {}),
    },
  );
}
