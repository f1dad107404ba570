import type pg from 'pg';
import type { ShardctlConfig } from '../config/types.js';
import { shardSchemaName } from '../config/types.js';
import { describePgError } from '../fleet/connect.js';
import { CONTROL_SCHEMA } from '../fleet/control.js';
import type { HostSnapshot } from '../fleet/catalog.js';
import { decodeId, maxTimeOffsetMs, timeBits } from '../id/layout.js';
import { renderNextIdControlSql, renderNextIdSql } from '../id/sql.js';
import type { MigrationFile } from '../migrations/files.js';
import { quoteIdent, quoteLiteral } from '../pg/quote.js';
import { parsePublishedFunction, publishedLayoutProblems } from './published.js';
import { ADOPTED_WRAPPER_COMMENT } from './sql.js';
import { rollbackQuietly } from '../pg/quiet.js';

/**
 * The planner's eyes: what each mapped schema on a host holds (its next_id functions, the sequence
 * the published one draws from, the tables whose defaults call it, their smallest and largest ids),
 * and every reason it cannot be adopted safely. Reads only; a few round trips per host.
 */

/** Stored ids may carry a time this far (ms) past the server's clock (clocks of the hosts that made them). */
export const ADOPT_CLOCK_SKEW_MS = 10_000;

export type ShardAction = 'switch' | 'record' | 'none';

export interface ShardInspection {
  readonly shard: number;
  readonly schema: string;
  /** switch: published next_id() to replace; record: switched by an earlier run, not recorded; none: already shardctl's. */
  readonly action: ShardAction;
  /** The sequence the published function draws from (switch, record). */
  readonly sequence: string | null;
  readonly tables: readonly { readonly table: string; readonly column: string }[];
  /** Why the shard cannot be adopted; empty when it can. */
  readonly refusals: readonly string[];
  /** Whether the connecting role may change (so read) the schema and everything in it. */
  readonly owned: boolean;
}

interface FunctionRow {
  schema: string;
  args: string;
  language: string;
  source: string;
  comment: string | null;
  oid: string;
}

interface DefaultRow {
  function: string;
  schema: string;
  table: string;
  column: string;
  type: string;
}

interface SequenceRow {
  name: string;
  kind: string | null;
  increment: string | null;
  max: string | null;
  cache: string | null;
  others: string | null;
}

/** Reads and judges every mapped (and wanted) shard schema that exists on the host. */
export async function inspectShards(
  client: pg.Client,
  config: ShardctlConfig,
  snapshot: HostSnapshot,
  shards: readonly number[],
): Promise<ShardInspection[]> {
  const schemas = shards.map((shard) => shardSchemaName(config, shard));
  const functions = (
    await client.query<FunctionRow>(
      `SELECT n.nspname AS schema, pg_catalog.pg_get_function_arguments(p.oid) AS args, l.lanname AS language,
              p.prosrc AS source, pg_catalog.obj_description(p.oid, 'pg_proc') AS comment, p.oid::text AS oid
         FROM pg_catalog.pg_proc p
         JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
         JOIN pg_catalog.pg_language l ON l.oid = p.prolang
        WHERE p.proname = 'next_id' AND n.nspname = ANY($1::text[])`,
      [schemas],
    )
  ).rows;
  const defaults = (
    await client.query<DefaultRow>(
      `SELECT d.refobjid::text AS function, n.nspname AS schema, c.relname AS table, a.attname AS column, pg_catalog.format_type(a.atttypid, a.atttypmod) AS type
         FROM pg_catalog.pg_depend d
         JOIN pg_catalog.pg_attrdef ad ON ad.oid = d.objid
         JOIN pg_catalog.pg_class c ON c.oid = ad.adrelid
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
         JOIN pg_catalog.pg_attribute a ON a.attrelid = ad.adrelid AND a.attnum = ad.adnum
        WHERE d.classid = 'pg_catalog.pg_attrdef'::regclass AND d.refclassid = 'pg_catalog.pg_proc'::regclass
          AND d.refobjid = ANY($1::oid[])
        ORDER BY c.relname, a.attnum`,
      [functions.map((f) => f.oid)],
    )
  ).rows;

  // Adoption replaces the schema's next_id() and its tables' defaults: the connecting role must have
  // the rights of every owner there (superusers have). A schema it may not change is refused as
  // such, and not read further (its objects may not even be visible to the role).
  const notHeld = new Map(
    (
      await client.query<{ schema: string; owners: string[]; role: string }>(
        `SELECT n.nspname AS schema, array_agg(DISTINCT r.rolname::text ORDER BY r.rolname::text) AS owners, current_user AS role
           FROM pg_catalog.pg_namespace n
           CROSS JOIN LATERAL (SELECT n.nspowner AS owner
                               UNION SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.relnamespace = n.oid
                               UNION SELECT p.proowner FROM pg_catalog.pg_proc p WHERE p.pronamespace = n.oid) o
           JOIN pg_catalog.pg_roles r ON r.oid = o.owner
          WHERE n.nspname = ANY($1::text[]) AND NOT pg_catalog.pg_has_role(o.owner, 'USAGE')
          GROUP BY n.nspname`,
        [schemas],
      )
    ).rows.map((r) => [r.schema, r]),
  );
  const drafts = shards.map((shard, i): ShardInspection => {
    const held = notHeld.get(schemas[i]!);
    if (held)
      return {
        shard,
        schema: schemas[i]!,
        action: 'switch',
        sequence: null,
        tables: [],
        owned: false,
        refusals: [
          `${held.role} may not change the schema's objects, owned by ${held.owners.join(', ')}: run adopt as ${held.owners.length === 1 ? 'that role' : 'a role with their rights'} or a superuser, or GRANT ${held.owners.map(quoteIdent).join(', ')} TO ${quoteIdent(held.role)}`,
        ],
      };
    return draftShard(
      config,
      shard,
      schemas[i]!,
      functions.filter((f) => f.schema === schemas[i]),
      defaults,
    );
  });
  const sequences = await readSequences(
    client,
    drafts.filter((d) => d.sequence !== null).map((d) => `${quoteIdent(d.schema)}.${quoteIdent(d.sequence!)}`),
  );
  const users = await readSequenceUsers(
    client,
    drafts
      .filter((d) => d.action === 'switch' && d.sequence !== null)
      .map((d) => `${quoteIdent(d.schema)}.${quoteIdent(d.sequence!)}`),
  );
  const ids = await readIdRanges(
    client,
    drafts.filter((d) => d.action === 'switch' && d.refusals.length === 0),
  );
  const maxPosition = (1n << BigInt(timeBits(config.idLayout) + config.idLayout.sequenceBits)) - 1n;

  return drafts.map((draft) => {
    const refusals = [...draft.refusals];
    if (draft.action === 'switch' && draft.sequence !== null) {
      const name = `${quoteIdent(draft.schema)}.${quoteIdent(draft.sequence)}`;
      const seq = sequences.get(name);
      if (!seq || seq.kind === null)
        refusals.push(`next_id() draws from ${draft.schema}.${draft.sequence}, which does not exist`);
      else if (seq.kind !== 'S')
        refusals.push(`next_id() draws from ${draft.schema}.${draft.sequence}, which is not a sequence`);
      else {
        if (seq.increment !== '1')
          refusals.push(
            `sequence ${draft.schema}.${draft.sequence} has INCREMENT ${seq.increment}; shardctl's next_id needs 1 (ALTER SEQUENCE ... INCREMENT 1)`,
          );
        if (seq.cache !== '1') {
          refusals.push(
            `sequence ${draft.schema}.${draft.sequence} has CACHE ${seq.cache}; shardctl's next_id needs CACHE 1 (ALTER SEQUENCE ... CACHE 1, and restart the sessions that hold cached values)`,
          );
        }
        if (BigInt(seq.max!) < maxPosition) {
          refusals.push(
            `sequence ${draft.schema}.${draft.sequence} stops at ${seq.max}, below the layout's last position ${maxPosition} (ALTER SEQUENCE ... AS bigint NO MAXVALUE)`,
          );
        }
        if (seq.others)
          refusals.push(
            `sequence ${draft.schema}.${draft.sequence} is also the default of ${seq.others}: moving it would change those ids`,
          );
        for (const user of users.get(name) ?? [])
          refusals.push(
            `sequence ${draft.schema}.${draft.sequence} is also used by ${user}: after adoption the sequence counts shardctl's positions, not the article's counter, so what that code draws from it would not be an id of the shard; make it call next_id() instead`,
          );
      }
    }
    if (draft.action === 'switch') refusals.push(...idProblems(config, draft, ids));
    return { ...draft, refusals };
  });

  function draftShard(
    config: ShardctlConfig,
    shard: number,
    schema: string,
    fns: readonly FunctionRow[],
    allDefaults: readonly DefaultRow[],
  ): ShardInspection {
    const refusals: string[] = [];
    const published = fns.find(
      (f) => f.args === 'OUT result bigint' && f.language === 'plpgsql' && !isAdoptedWrapper(f),
    );
    const wrapper = fns.find((f) => f.args === 'OUT result bigint' && isAdoptedWrapper(f));
    const own = fns.find((f) => f.args === 'seq regclass' && /shardctl next_id v\d+/.test(f.comment ?? ''));
    for (const f of fns) {
      if (f === published || f === wrapper || f === own) continue;
      refusals.push(`next_id(${f.args}) (${f.language}) is not an id function shardctl knows`);
    }
    if (fns.length === 0) refusals.push(`the schema has no id function next_id()`);
    const recorded = snapshot.recorded.has(shard);
    if (!published) {
      if (wrapper && own) {
        const sequence = /next_id\('(?:"[^"]*"|[^".']+)\."?([^"']+)"?'::regclass\)/.exec(wrapper.source)?.[1] ?? null;
        return { shard, schema, action: recorded ? 'none' : 'record', sequence, tables: [], refusals, owned: true };
      }
      if (own && recorded) return { shard, schema, action: 'none', sequence: null, tables: [], refusals, owned: true };
      if (own) refusals.push(`the schema has shardctl's next_id(seq) but is not recorded; run shardctl init`);
      return { shard, schema, action: 'switch', sequence: null, tables: [], refusals, owned: true };
    }
    const parsed = parsePublishedFunction(published.source);
    if (!parsed) {
      refusals.push(
        `next_id() is not the published function (its body differs from the article's); shardctl replaces only that one`,
      );
      return { shard, schema, action: 'switch', sequence: null, tables: [], refusals, owned: true };
    }
    const problems = publishedLayoutProblems(parsed, config.idLayout, shard, schema);
    for (const problem of problems) refusals.push(`layout: next_id() disagrees with the config: ${problem}`);
    const users = allDefaults.filter((d) => d.function === published.oid);
    for (const t of users.filter((u) => u.schema !== schema)) {
      refusals.push(
        `table ${t.schema}.${t.table}, outside the schema, takes its ${t.column} from ${schema}.next_id(); its ids would not be checked`,
      );
    }
    const tables = users.filter((u) => u.schema === schema);
    for (const t of tables) {
      if (t.type !== 'bigint')
        refusals.push(`table ${schema}.${t.table}: column ${t.column} is ${t.type}; ids need bigint`);
    }
    const sequence = parsed.sequence && parsed.sequence.schema === schema ? parsed.sequence.name : null;
    return {
      shard,
      schema,
      action: 'switch',
      sequence,
      tables: tables.map((t) => ({ table: t.table, column: t.column })),
      refusals,
      owned: true,
    };
  }
}

function isAdoptedWrapper(f: FunctionRow): boolean {
  return (f.comment ?? '').startsWith(ADOPTED_WRAPPER_COMMENT);
}

async function readSequences(client: pg.Client, names: readonly string[]): Promise<Map<string, SequenceRow>> {
  if (names.length === 0) return new Map();
  // A default that names its sequence as text (nextval('s'::text), or ('s'::text)::regclass, as
  // databases from before PostgreSQL 8.1 have them) records no dependency on it: such defaults are
  // read once, their sequence resolved by name, and count as the sequence's other users too.
  const result = await client.query<SequenceRow>(
    `WITH textual AS (
       SELECT ad.adrelid, pg_catalog.to_regclass(pg_catalog.replace(m[1], '''''', '''')) AS seq
         FROM pg_catalog.pg_attrdef ad
        CROSS JOIN LATERAL pg_catalog.regexp_match(pg_catalog.pg_get_expr(ad.adbin, ad.adrelid),
                                                   'nextval\\(\\(?''((?:[^'']|'''')+)''::text') AS m
        WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_depend d JOIN pg_catalog.pg_class r ON r.oid = d.refobjid
                           WHERE d.classid = 'pg_catalog.pg_attrdef'::regclass AND d.objid = ad.oid
                             AND d.refclassid = 'pg_catalog.pg_class'::regclass AND r.relkind = 'S'))
     SELECT q.name, c.relkind::text AS kind, s.seqincrement::text AS increment, s.seqmax::text AS max, s.seqcache::text AS cache,
            (SELECT string_agg(DISTINCT o.adrelid::regclass::text, ', ')
               FROM (SELECT ad.adrelid
                       FROM pg_catalog.pg_depend d JOIN pg_catalog.pg_attrdef ad ON ad.oid = d.objid
                      WHERE d.classid = 'pg_catalog.pg_attrdef'::regclass AND d.refclassid = 'pg_catalog.pg_class'::regclass
                        AND d.refobjid = c.oid
                     UNION ALL
                     SELECT t.adrelid FROM textual t WHERE t.seq = c.oid) o) AS others
       FROM unnest($1::text[]) AS q(name)
       LEFT JOIN pg_catalog.pg_class c ON c.oid = pg_catalog.to_regclass(q.name)
       LEFT JOIN pg_catalog.pg_sequence s ON s.seqrelid = c.oid`,
    [names],
  );
  return new Map(result.rows.map((r) => [r.name, r]));
}

/**
 * What else uses each sequence (`schema.name`, quoted) than the functions called next_id (the
 * published one and its adopted wrapper in every schema, here or in a moved shard's old copy;
 * another next_id in a shard schema is refused as unknown) and shardctl's own:
 *  - a function whose text names it: PL/pgSQL records no dependency (a trigger setting
 *    `NEW.id := nextval('…table_id_seq')`, wherever it lives), so it is found by the sequence's
 *    name, and a function naming another shard's sequence of the same name counts too;
 *  - a view or SQL-standard function that depends on it.
 * Defaults are readSequences's `others`. Each user named schema-qualified (`function public.set_id()`).
 */
async function readSequenceUsers(client: pg.Client, names: readonly string[]): Promise<Map<string, string[]>> {
  if (names.length === 0) return new Map();
  const result = await client.query<{ name: string; users: string[] }>(
    `WITH seqs AS (
       SELECT q.name, c.oid, pg_catalog.lower(c.relname) AS relname
         FROM unnest($1::text[]) AS q(name)
         JOIN pg_catalog.pg_class c ON c.oid = pg_catalog.to_regclass(q.name)),
     named AS (
       SELECT r.relname, 'function ' || pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(p.proname)
                || '(' || pg_catalog.pg_get_function_identity_arguments(p.oid) || ')' AS what
         FROM (SELECT DISTINCT relname FROM seqs) r
         JOIN pg_catalog.pg_proc p ON pg_catalog.strpos(pg_catalog.lower(p.prosrc), r.relname) > 0
         JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', $2)
          AND p.proname <> 'next_id'),
     depending AS (
       SELECT s.name, pg_catalog.pg_describe_object(d.classid, d.objid, d.objsubid) AS what
         FROM seqs s
         JOIN pg_catalog.pg_depend d ON d.refclassid = 'pg_catalog.pg_class'::regclass AND d.refobjid = s.oid
        WHERE d.deptype = 'n' AND d.classid <> 'pg_catalog.pg_attrdef'::regclass)
     SELECT s.name, array(SELECT what FROM named m WHERE m.relname = s.relname
                          UNION SELECT what FROM depending d WHERE d.name = s.name ORDER BY 1) AS users
       FROM seqs s`,
    [names, CONTROL_SCHEMA],
  );
  return new Map(result.rows.filter((r) => r.users.length > 0).map((r) => [r.name, r.users]));
}

interface IdRange {
  readonly min: bigint | null;
  readonly max: bigint | null;
}

/** The smallest and largest id of every table, and the server's clock (Unix ms), in one statement. */
async function readIdRanges(
  client: pg.Client,
  shards: readonly ShardInspection[],
): Promise<{ now: bigint; ranges: Map<string, IdRange> }> {
  const parts = shards.flatMap((s) =>
    s.tables.map(
      (t) =>
        `SELECT ${quoteLiteral(`${s.schema}.${t.table}`)} AS name, min(${quoteIdent(t.column)})::text AS min, max(${quoteIdent(t.column)})::text AS max FROM ${quoteIdent(s.schema)}.${quoteIdent(t.table)}`,
    ),
  );
  const nowSql = `SELECT NULL AS name, pg_catalog.floor(EXTRACT(epoch FROM pg_catalog.clock_timestamp()) * 1000)::bigint::text AS min, NULL AS max`;
  const result = await client.query<{ name: string | null; min: string | null; max: string | null }>(
    [nowSql, ...parts].join('\nUNION ALL\n'),
  );
  const ranges = new Map<string, IdRange>();
  let now = 0n;
  for (const row of result.rows) {
    if (row.name === null) now = BigInt(row.min!);
    else
      ranges.set(row.name, {
        min: row.min === null ? null : BigInt(row.min),
        max: row.max === null ? null : BigInt(row.max),
      });
  }
  return { now, ranges };
}

/** Stored ids that the config's layout cannot have made for this shard. */
function idProblems(
  config: ShardctlConfig,
  shard: ShardInspection,
  ids: { now: bigint; ranges: Map<string, IdRange> },
): string[] {
  const problems: string[] = [];
  const layout = config.idLayout;
  for (const t of shard.tables) {
    const range = ids.ranges.get(`${shard.schema}.${t.table}`);
    if (!range || range.min === null || range.max === null) continue;
    const where = `table ${shard.schema}.${t.table}`;
    if (range.min < 0n) {
      problems.push(
        `${where}: id ${range.min} is negative; it does not fit the layout (the published function overflowed into the sign bit)`,
      );
      continue;
    }
    for (const [which, id] of [
      ['smallest', range.min],
      ['largest', range.max],
    ] as const) {
      const decoded = decodeId(id, layout);
      if (decoded.shard !== shard.shard)
        problems.push(
          `${where}: its ${which} id ${id} decodes to shard ${decoded.shard}, not ${shard.shard} (ids of another shard, or another bit split)`,
        );
      if (decoded.unixMs > ids.now + BigInt(ADOPT_CLOCK_SKEW_MS)) {
        problems.push(
          `${where}: its ${which} id ${id} decodes to ${decoded.timestamp}, in the future (the config's idLayout.epoch or bits disagree with the stored ids)`,
        );
      }
      if (decoded.unixMs - layout.epochMs > maxTimeOffsetMs(layout))
        problems.push(`${where}: its ${which} id ${id} does not fit the layout's time bits`);
    }
  }
  return problems;
}

/**
 * What --baseline checks: the baseline files run in a scratch schema (with shardctl's next_id, as on
 * a shard init makes) inside a transaction that is rolled back, and every relation they create
 * (table, sequence, view, materialized view, index) must exist in each shard's schema with the same
 * kind, every table with exactly the same columns (names, types and NOT NULL; a type of the
 * schema's own, such as an enum the files create, compared by its name within the schema, as
 * src/migrations/shape.ts does), every index with the same definition. A move builds the target
 * from these files, so they must describe the schema as it is. Files marked no-transaction (CREATE
 * INDEX CONCURRENTLY) are not run: what they create (indexes) is not checked. Returns the problems
 * per shard, and one for the host when the files do not run.
 */
export async function checkBaseline(
  client: pg.Client,
  config: ShardctlConfig,
  files: readonly MigrationFile[],
  schemas: readonly { shard: number; schema: string }[],
): Promise<{ host: string | null; shards: Map<number, string[]> }> {
  const scratch = 'shardctl_adopt_baseline_check';
  const shardsProblems = new Map<number, string[]>();
  if (schemas.length === 0 || files.length === 0) return { host: null, shards: shardsProblems };
  try {
    await client.query(
      [
        'BEGIN;',
        `CREATE SCHEMA ${quoteIdent(scratch)};`,
        // The slow path too, in the scratch schema: the host may have no control schema yet.
        renderNextIdControlSql(config.idLayout, config.schemaPrefix, scratch),
        renderNextIdSql(scratch, 0, config.idLayout, { fresh: true, control: scratch }),
        `SET LOCAL search_path TO ${quoteIdent(scratch)};`,
        ...files.filter((f) => !f.noTransaction).map((f) => `-- ${f.name}.sql\n${f.sql.trimEnd()}\n;`),
      ].join('\n'),
    );
  } catch (error) {
    await rollbackQuietly(client);
    return {
      host: `the baseline files do not run in a scratch schema: ${describePgError(error)}`,
      shards: shardsProblems,
    };
  }
  try {
    const rows = (
      await client.query<{ schema: string; relation: string; kind: string; columns: string | null }>(
        `SELECT n.nspname AS schema, c.relname AS relation, c.relkind::text AS kind,
                CASE WHEN c.relkind IN ('i', 'I')
                     THEN pg_catalog.replace(pg_catalog.pg_get_indexdef(c.oid), pg_catalog.quote_ident(n.nspname) || '.', '')
                     ELSE (SELECT string_agg(a.attname || ' ' || pg_catalog.replace(pg_catalog.format_type(a.atttypid, a.atttypmod), pg_catalog.quote_ident(n.nspname) || '.', '')
                                             || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END, ', ' ORDER BY a.attname)
                             FROM pg_catalog.pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped)
                END AS columns
           FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
          WHERE n.nspname = ANY($1::text[]) AND c.relkind IN ('r', 'p', 'S', 'v', 'm', 'i', 'I')`,
        [[scratch, ...schemas.map((s) => s.schema)]],
      )
    ).rows;
    const expected = rows.filter((r) => r.schema === scratch);
    for (const { shard, schema } of schemas) {
      const problems: string[] = [];
      for (const want of expected) {
        const have = rows.find((r) => r.schema === schema && r.relation === want.relation);
        const what = `${kindName(want.kind)} ${schema}.${want.relation}`;
        if (!have) problems.push(`baseline: ${what} does not exist`);
        else if (have.kind !== want.kind)
          problems.push(
            `baseline: ${schema}.${want.relation} is a ${kindName(have.kind)}, the files create a ${kindName(want.kind)}`,
          );
        else if ((want.kind === 'r' || want.kind === 'p') && have.columns !== want.columns) {
          problems.push(
            `baseline: ${what} has columns (${have.columns ?? ''}), the files create (${want.columns ?? ''})`,
          );
        } else if ((want.kind === 'i' || want.kind === 'I') && have.columns !== want.columns) {
          problems.push(`baseline: ${what} is ${have.columns ?? ''}; the files create ${want.columns ?? ''}`);
        }
      }
      if (problems.length > 0) shardsProblems.set(shard, problems);
    }
  } finally {
    await client.query('ROLLBACK');
  }
  return { host: null, shards: shardsProblems };
}

function kindName(kind: string): string {
  return (
    { r: 'table', p: 'table', S: 'sequence', v: 'view', m: 'materialized view', i: 'index', I: 'index' }[kind] ?? kind
  );
}
