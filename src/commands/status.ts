import type pg from 'pg';
import type { ShardctlConfig } from '../config/types.js';
import { hostForShard, shardSchemaName } from '../config/types.js';
import { formatShardList, parseShardList } from '../config/ranges.js';
import { failureReason, finishMove, type NextStep } from '../errors.js';
import { ID_FUNCTION_VERSION } from '../id/sql.js';
import { describePgError } from '../fleet/connect.js';
import {
  invalidIndexes,
  readHostSnapshot,
  sequenceProblems,
  shardSchemaCondition,
  type HostSnapshot,
} from '../fleet/catalog.js';
import { withSession } from '../fleet/session.js';
import { readTopology, type HostTopology } from '../fleet/topology.js';
import { abortingMoveIds, slowPathChangingOver } from '../fleet/control.js';
import { otherWritablePrimaries } from '../fleet/primaries.js';
import { withReadHint } from '../fleet/rights.js';
import { hasSqlState, INSUFFICIENT_PRIVILEGE } from '../pg/sqlstate.js';
import {
  mapDisagreements,
  mergePlacement,
  readPlacementView,
  controlWritersSql,
  hostAddress,
  type FleetPlacement,
  type HostPlacementView,
} from '../fleet/placement.js';
import { readMigrations, type MigrationFile } from '../migrations/files.js';
import { handMadeDrift } from '../migrations/shape.js';
import {
  driftProblems,
  fileRollout,
  pendingMigrations,
  shardLevel,
  type AppliedMigrations,
  type FileRollout,
} from '../migrations/rules.js';
import { findLeftovers } from '../moves/leftovers.js';
import { existingApplied, handBuiltShards } from '../provisioning/plan.js';

export interface HostStatus {
  readonly host: string;
  readonly reachable: boolean;
  /** Reached, but its role may not read what status reads (SQLSTATE 42501): error says what to grant. */
  readonly denied: boolean;
  readonly error: string | null;
  readonly serverVersion: string | null;
  /** Shards the map gives this host. */
  readonly expected: number;
  /** Of those, how many have their schema here. */
  readonly present: number;
  /** Mapped here, schema absent. */
  readonly missing: readonly number[];
  /** Schema here, mapped to another host (and not a fenced old copy). */
  readonly unexpected: readonly number[];
  /** Old copies left by a finished move, waiting for gc. */
  readonly fenced: readonly number[];
  /** Copies a move is bringing here (running, or interrupted: finish with --resume or undo with --abort). */
  readonly incoming: readonly number[];
  /** Shards mapped here whose copy is fenced: a move is cutting over, or was interrupted after the fence; they refuse writes. */
  readonly refusingWrites: readonly number[];
  /** Sequences in shard schemas with CACHE > 1, which next_id() refuses (SQLSTATE SC004): `schema.sequence`. */
  readonly cachedSequences: readonly string[];
  /** Id sequences next_id() would repeat ids from (behind their table's ids, or another shard's), naming shard and table. */
  readonly sequenceProblems: readonly string[];
  /**
   * Present mapped shards whose schema shardctl neither created nor took over (no next_id(seq) of
   * its own, no record): built by hand, or not reached by a killed or partial adopt. init refuses
   * them; adopt takes them over.
   */
  readonly handBuilt: readonly number[];
  /** Present shards shardctl created or took over whose next_id() is missing or older than this shardctl's (init reinstalls it). */
  readonly nextIdOutdated: readonly number[];
  /**
   * next_id's slow path is still changing over from its row lock (docs/ids.md, "Changing over"): a
   * transaction from before the upgrade was running when the last run tried to finish it. Correct
   * meanwhile, at one more transaction id per slow-path call; the next init, migrate or move finishes
   * it. Not a problem for `ok`.
   */
  readonly slowPathChangingOver: boolean;
  /** Present mapped shards by migration level (the highest version applied): level → shards (compact list). */
  readonly levels: Readonly<Record<string, string>>;
  /** Present mapped shards with pending migrations (what migrate would apply). */
  readonly behind: readonly number[];
  /** Drift, as migrate reports it: changed or deleted applied files, files out of order. */
  readonly drift: readonly string[];
  /**
   * Unfinished moves recorded on this host (finish with move-shard --resume, undo with --abort;
   * `aborting`: an abort of it was cut off, only --abort finishes it).
   */
  readonly moves: readonly {
    moveId: string;
    shards: string;
    source: string;
    target: string;
    aborting: boolean;
    /** Seen on the target: its copies are active, so the move can only be resumed. */
    switched: boolean;
  }[];
  /** What killed runs left on this host: probe subscriptions, replication objects of no running move (gc drops them). */
  readonly leftovers: readonly string[];
  /**
   * Control tables that a role other than their owner (or a superuser) can write, with that role:
   * such a role could redirect routers opened from seeds (the registry) or corrupt the placement.
   */
  readonly controlWriters: readonly { readonly table: string; readonly role: string }[];
  /**
   * The address reached (the primary, for a url of several addresses) and the standbys streaming
   * from it (pg_stat_replication) with their lag; null for a host that could not be read.
   */
  readonly topology: HostTopology | null;
  /**
   * Other addresses of the host's url that answer as a writable primary of this host too (an old
   * primary started again as a primary after a failover: split brain; map.ts otherWritablePrimaries).
   */
  readonly twoPrimaries: readonly string[];
  /** Hosts whose address in this host's registry differs from the file's url (user and password aside). */
  readonly registryMismatches: readonly { readonly name: string; readonly registry: string; readonly file: string }[];
  readonly ok: boolean;
}

/**
 * The file's map against the fleet's placement (what the hosts say; see src/fleet/placement.ts).
 * Only the hosts of `readFrom` are compared; with none, nothing below says anything of the fleet.
 */
export interface MapStatus {
  /** Hosts whose records the placement was read from, in the file's order. */
  readonly readFrom: readonly string[];
  /** Hosts whose records could not be read (unreachable, or not readable by this role): not compared. */
  readonly notRead: readonly string[];
  /** Null: none of the hosts read has recorded a fleet (init or adopt records it). */
  readonly fleetId: string | null;
  /** Decimal string. */
  readonly placementVersion: string;
  /** Shards the file places elsewhere than the fleet: compact lists. */
  readonly disagreements: readonly { shards: string; file: string | null; fleet: string; unknownHost: boolean }[];
  /** Hosts of the fleet's registry that the file does not list. */
  readonly unlistedHosts: readonly string[];
  /** Contradictions between hosts (two fleet ids, a shard active on two hosts). */
  readonly problems: readonly string[];
}

export interface StatusResult {
  readonly latestVersion: number;
  readonly hosts: readonly HostStatus[];
  readonly map: MapStatus;
  /** The files not yet on every present mapped shard of the hosts read: `0004_views: 12 of 2048 shards`. */
  readonly rollout: readonly FileRollout[];
  /**
   * What moves the fleet forward, as data: the unfinished moves' --resume or --abort (--abort alone
   * for a move whose abort was cut off); adopt for schemas built by hand, else init for an outdated
   * next_id() or a fleet with no records yet. Empty when nothing waits on a command.
   */
  readonly next: readonly NextStep[];
  /** Every host was read and nothing is off. */
  readonly ok: boolean;
}

/** Per host: expected, present, missing, misplaced shards, migration levels and drift. A few queries per host. */
export async function status(config: ShardctlConfig): Promise<StatusResult> {
  const migrations = await readMigrations(config.migrationsDir);
  const latestVersion = migrations.at(-1)?.version ?? 0;
  const views: HostPlacementView[] = [];
  const present: (AppliedMigrations | undefined)[] = [];
  // Each host is judged by where the fleet places the shards (a file from before a move would call
  // the moved shard missing on its new host and refusing writes on its old one): every session
  // reads its host's view of the placement first and waits for the others' before judging.
  const placed = placementBarrier(config.hosts.length, views);
  const hosts = await Promise.all(
    config.hosts.map(async (host): Promise<HostStatus> => {
      let viewRead = false;
      try {
        return await withSession(
          host,
          async (session) => {
            const view = await readPlacementView(session.client, host.name);
            views.push(view);
            viewRead = true;
            placed.arrived();
            const judged = judgedConfig(config, await placed.merged);
            const judgedHost = judged.hosts.find((h) => h.name === host.name) ?? host;
            const controlWriters = (await session.client.query<{ table: string; role: string }>(controlWritersSql()))
              .rows;
            const registryMismatches = [...view.registry].flatMap(([name, registry]) => {
              const listed = config.hosts.find((h) => h.name === name);
              const file = listed ? hostAddress(listed.url) : null;
              return file !== null && file !== registry ? [{ name, registry, file }] : [];
            });
            const snapshot = { ...(await readHostSnapshot(session, judged)), host: judgedHost };
            for (const shard of judgedHost.shards)
              if (snapshot.schemas.has(shard)) present.push(snapshot.applied.get(shard));
            const leftovers = (await findLeftovers(session.client)).map((l) => `${l.kind} ${l.name}`);
            const cached = await cachedSequences(session.client, config.schemaPrefix);
            // An incoming copy's sequences are carried by its move at the switch: until then they
            // are behind its rows by design, and the move's --resume or --abort is what to do.
            const arriving = new Set(
              [...snapshot.recorded].filter(([, row]) => row.state === 'incoming').map(([shard]) => shard),
            );
            const sequences = await sequenceProblems(session.client, judged, arriving).catch((e: unknown) => [
              `cannot check the id sequences: ${describePgError(e)}`,
            ]);
            const found = hostStatus(judged, snapshot, migrations, cached, leftovers);
            const byHand =
              snapshot.layout === null
                ? []
                : await handMadeDrift(
                    session.client,
                    host.name,
                    (shard) => shardSchemaName(judged, shard),
                    (shard) => {
                      const next = pendingMigrations(snapshot.applied.get(shard), migrations)[0];
                      return next?.noTransaction ? next.name : undefined;
                    },
                  );
            const invalid =
              snapshot.layout === null ? [] : await invalidIndexDrift(session.client, config.schemaPrefix);
            const extra = [...byHand, ...invalid];
            const drifted = extra.length === 0 ? found : { ...found, drift: [...found.drift, ...extra], ok: false };
            const topology = await readTopology(session.client);
            // The fleet record the placement view read above (a standby's is its primary's: not asked there).
            const own = topology.inRecovery ? null : view.fleet;
            const twoPrimaries = own
              ? await otherWritablePrimaries(host, topology.primary, own, { applicationName: 'shardctl status' })
              : [];
            const slowPath = await slowPathChangingOver(session.client);
            const result = {
              ...drifted,
              controlWriters,
              registryMismatches,
              topology,
              twoPrimaries,
              slowPathChangingOver: slowPath,
            };
            const trusted = controlWriters.length === 0 && registryMismatches.length === 0 && twoPrimaries.length === 0;
            const checked = trusted ? result : { ...result, ok: false };
            return sequences.length === 0 ? checked : { ...checked, sequenceProblems: sequences, ok: false };
          },
          { applicationName: 'shardctl status' },
        );
      } catch (error) {
        if (!viewRead) placed.arrived();
        const denied = hasSqlState(error, INSUFFICIENT_PRIVILEGE);
        const reason = withReadHint(failureReason(error, describePgError), error, host.url);
        return unreachableStatus(host.name, host.shards.length, reason, denied);
      }
    }),
  );
  const map = mapStatus(config, mergePlacement(views), new Set(views.map((v) => v.reachedAs)));
  const aborting = abortingMoveIds(hosts.flatMap((h) => h.moves));
  for (const h of hosts) for (const m of h.moves) if (aborting.has(m.moveId)) m.aborting = true;
  const mapOk = map.disagreements.length === 0 && map.problems.length === 0;
  return {
    latestVersion,
    hosts,
    map,
    rollout: fileRollout(migrations, present),
    next: [...unfinishedMovesNext(hosts), ...setupNext(hosts, map)],
    ok: hosts.every((h) => h.ok) && mapOk,
  };
}

/** Resolves with the merged placement once `count` hosts have read their view (or failed before it). */
function placementBarrier(
  count: number,
  views: readonly HostPlacementView[],
): { arrived: () => void; merged: Promise<FleetPlacement> } {
  let left = count;
  let release!: (placement: FleetPlacement) => void;
  const merged = new Promise<FleetPlacement>((resolve) => (release = resolve));
  return {
    arrived: () => {
      left -= 1;
      if (left === 0) release(mergePlacement(views));
    },
    merged,
  };
}

/**
 * The file with each listed host's shards where the fleet places them: the shards the fleet knows
 * and puts on a host of the file. The file as it is when the hosts contradict each other, or the
 * fleet has another layout (both reported under the map).
 */
function judgedConfig(config: ShardctlConfig, placement: FleetPlacement): ShardctlConfig {
  const layout = placement.layout;
  const otherLayout = layout && (layout.schemaPrefix !== config.schemaPrefix || layout.shardCount !== config.shards);
  if (placement.problems.length > 0 || otherLayout || placement.owners.size === 0) return config;
  const owner = new Map<number, string>();
  for (const host of config.hosts) for (const shard of host.shards) owner.set(shard, host.name);
  for (const [shard, host] of placement.owners)
    if (shard < config.shards && config.hosts.some((h) => h.name === host)) owner.set(shard, host);
  const moved = config.hosts.some((h) => h.shards.some((shard) => owner.get(shard) !== h.name));
  if (!moved) return config;
  return {
    ...config,
    hosts: config.hosts.map((h) => ({
      ...h,
      shards: [...owner]
        .filter(([, name]) => name === h.name)
        .map(([shard]) => shard)
        .sort((a, b) => a - b),
    })),
  };
}

/**
 * Each unfinished move once (both of its hosts record it): --resume or --abort; --abort alone when
 * an abort of it began; --resume alone when it switched (its target's copies are active).
 */
function unfinishedMovesNext(hosts: readonly HostStatus[]): NextStep[] {
  const moves = new Map<string, { shards: string; aborting: boolean; switched: boolean }>();
  for (const h of hosts)
    for (const m of h.moves) {
      const seen = moves.get(m.moveId);
      moves.set(m.moveId, {
        shards: m.shards,
        aborting: m.aborting || (seen?.aborting ?? false),
        switched: m.switched || (seen?.switched ?? false),
      });
    }
  return [...moves.values()].flatMap((m) => {
    const parsed = parseShardList(m.shards);
    if (!('shards' in parsed)) return [];
    return m.switched ? [{ action: 'resume' as const, shards: parsed.shards }] : finishMove(parsed.shards, m.aborting);
  });
}

/**
 * adopt for the schemas built by hand: init refuses the whole run while any exist (the rule of
 * handBuiltShards). Otherwise init, for an outdated next_id() or, every host read, no fleet
 * recorded. Only from what was read: a host that could not be read is advised nothing.
 */
function setupNext(hosts: readonly HostStatus[], map: MapStatus): NextStep[] {
  const handBuilt = hosts.flatMap((h) => h.handBuilt).sort((a, b) => a - b);
  if (handBuilt.length > 0) return [{ action: 'adopt', shards: handBuilt }];
  const unrecorded = map.fleetId === null && map.readFrom.length > 0 && map.notRead.length === 0;
  return unrecorded || hosts.some((h) => h.nextIdOutdated.length > 0) ? [{ action: 'init' }] : [];
}

function mapStatus(config: ShardctlConfig, placement: FleetPlacement, read: ReadonlySet<string>): MapStatus {
  return {
    readFrom: config.hosts.filter((h) => read.has(h.name)).map((h) => h.name),
    notRead: config.hosts.filter((h) => !read.has(h.name)).map((h) => h.name),
    fleetId: placement.fleetId,
    placementVersion: placement.version.toString(),
    disagreements: mapDisagreements(config, placement, placement.moving).map((d) => ({
      shards: formatShardList(d.shards),
      file: d.fileHost,
      fleet: d.fleetHost,
      unknownHost: d.unknownHost,
    })),
    unlistedHosts: [...placement.hosts.keys()].filter((name) => !config.hosts.some((h) => h.name === name)).sort(),
    problems: placement.problems,
  };
}

function hostStatus(
  config: ShardctlConfig,
  snapshot: HostSnapshot,
  migrations: readonly MigrationFile[],
  cached: readonly string[],
  leftovers: readonly string[],
): Omit<HostStatus, 'controlWriters' | 'registryMismatches' | 'topology' | 'twoPrimaries' | 'slowPathChangingOver'> {
  const host = snapshot.host;
  const drift = driftProblems(host.name, existingApplied(snapshot), snapshot.appliedNames, migrations).map(
    (p) => p.message,
  );
  const handBuilt = new Set(handBuiltShards(snapshot, host.shards));
  const missing: number[] = [];
  const behind: number[] = [];
  const outdated: number[] = [];
  const byLevel = new Map<number, number[]>();
  const refusingWrites: number[] = [];
  for (const shard of host.shards) {
    if (snapshot.recorded.get(shard)?.state === 'fenced') refusingWrites.push(shard);
    const schema = snapshot.schemas.get(shard);
    if (!schema) {
      missing.push(shard);
      continue;
    }
    if (schema.nextIdVersion !== ID_FUNCTION_VERSION && !handBuilt.has(shard)) outdated.push(shard);
    const applied = snapshot.applied.get(shard);
    const level = shardLevel(applied);
    let bucket = byLevel.get(level);
    if (!bucket) byLevel.set(level, (bucket = []));
    bucket.push(shard);
    // A shard built by hand is for adopt first (migrate does not take it): listed there, not here.
    if (!handBuilt.has(shard) && pendingMigrations(applied, migrations).length > 0) behind.push(shard);
  }
  const unexpected: number[] = [];
  const fenced: number[] = [];
  const incoming: number[] = [];
  for (const shard of [...snapshot.schemas.keys()].sort((a, b) => a - b)) {
    const mapped = shard < config.shards ? hostForShard(config, shard) : undefined;
    if (mapped?.name === host.name) continue;
    const state = snapshot.recorded.get(shard)?.state;
    if (state === 'incoming') incoming.push(shard);
    else if (state !== 'fenced') unexpected.push(shard);
  }
  // Old copies are renamed after a move, so they are found by their control rows, not their names.
  for (const [shard, row] of [...snapshot.recorded].sort((a, b) => a[0] - b[0])) {
    if (row.state === 'fenced' && hostForShard(config, shard)?.name !== host.name) fenced.push(shard);
  }
  const levels: Record<string, string> = {};
  for (const [level, shards] of [...byLevel].sort((a, b) => a[0] - b[0]))
    levels[String(level)] = formatShardList(shards);
  const byMove = new Map<string, { source: string; target: string; aborting: boolean; shards: number[] }>();
  for (const [shard, move] of snapshot.moving) {
    let entry = byMove.get(move.moveId);
    if (!entry)
      byMove.set(
        move.moveId,
        (entry = { source: move.source, target: move.target, aborting: move.aborting, shards: [] }),
      );
    entry.shards.push(shard);
  }
  const moves = [...byMove].map(([moveId, m]) => ({
    moveId,
    shards: formatShardList(m.shards),
    source: m.source,
    target: m.target,
    aborting: m.aborting,
    // The target's copies are active: the move switched (or was killed while switching), and can
    // only be resumed (an abort would leave two writable copies; switch.ts requireNotSwitched).
    switched: m.target === host.name && m.shards.some((shard) => snapshot.recorded.get(shard)?.state === 'active'),
  }));
  const ok =
    moves.length === 0 &&
    leftovers.length === 0 &&
    missing.length === 0 &&
    handBuilt.size === 0 &&
    unexpected.length === 0 &&
    incoming.length === 0 &&
    refusingWrites.length === 0 &&
    cached.length === 0 &&
    behind.length === 0 &&
    drift.length === 0 &&
    outdated.length === 0;
  return {
    host: host.name,
    reachable: true,
    denied: false,
    error: null,
    serverVersion: snapshot.serverVersion,
    expected: host.shards.length,
    present: host.shards.length - missing.length,
    missing,
    unexpected,
    fenced,
    incoming,
    refusingWrites,
    cachedSequences: cached,
    sequenceProblems: [],
    handBuilt: [...handBuilt],
    nextIdOutdated: outdated,
    levels,
    behind,
    drift,
    moves,
    leftovers,
    ok,
  };
}

function unreachableStatus(host: string, expected: number, error: string, denied = false): HostStatus {
  return {
    host,
    reachable: false,
    denied,
    error,
    serverVersion: null,
    expected,
    present: 0,
    missing: [],
    unexpected: [],
    fenced: [],
    incoming: [],
    refusingWrites: [],
    cachedSequences: [],
    sequenceProblems: [],
    handBuilt: [],
    nextIdOutdated: [],
    slowPathChangingOver: false,
    levels: {},
    behind: [],
    drift: [],
    moves: [],
    leftovers: [],
    controlWriters: [],
    registryMismatches: [],
    topology: null,
    twoPrimaries: [],
    ok: false,
  };
}

/**
 * Invalid indexes of shard schemas that no build is making now: what a CREATE INDEX CONCURRENTLY
 * that was stopped (a killed run, a lock it gave up on) left. Its IF NOT EXISTS would skip it, and
 * migrate refuses to record the migration while it is there: it must be dropped.
 */
async function invalidIndexDrift(client: pg.Client, prefix: string): Promise<string[]> {
  return (await invalidIndexes(client, { prefix })).map(
    ({ qualified }) =>
      `invalid index ${qualified}: a CREATE INDEX CONCURRENTLY that was stopped left it, and IF NOT EXISTS would skip it (migrate will not record the migration): DROP INDEX ${qualified}; then run migrate again`,
  );
}

/** Sequences of shard schemas with CACHE > 1: next_id() refuses them on its slow path (SC004). */
async function cachedSequences(client: pg.Client, prefix: string): Promise<string[]> {
  const result = await client.query<{ name: string }>(
    `SELECT format('%s.%s', n.nspname, c.relname) AS name
       FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid JOIN pg_namespace n ON n.oid = c.relnamespace
      WHERE s.seqcache <> 1 AND ${shardSchemaCondition('n.nspname')}
      ORDER BY 1 LIMIT 100`,
    [prefix],
  );
  return result.rows.map((r) => r.name);
}
