import type pg from 'pg';
import type { HostConfig, ShardctlConfig } from '../config/types.js';
import { HostError } from '../errors.js';
import { describePgError } from './connect.js';
import { quoteIdent, quoteLiteral } from '../pg/quote.js';
import { CONTROL, MOVE_ABORTING_SQL } from './control.js';
import type { HostSession } from './session.js';

/** What a host holds, read from its catalog and control schema in a handful of queries. */
export interface HostSnapshot {
  readonly host: HostConfig;
  readonly serverVersion: string;
  readonly serverVersionNum: number;
  /** Null when the control schema does not exist yet (a fresh host). */
  readonly layout: RecordedLayout | null;
  /** Shards recorded in the control schema, with their state. */
  readonly recorded: ReadonlyMap<number, { schema: string; state: string }>;
  /** Shard schemas (by the config's prefix) that exist in the catalog, and their next_id(). */
  readonly schemas: ReadonlyMap<number, ShardSchema>;
  /** shard → (version → checksum) of applied migrations. */
  readonly applied: ReadonlyMap<number, ReadonlyMap<number, string>>;
  /** version → file name (without .sql) as recorded when it was applied; names a deleted file. */
  readonly appliedNames: ReadonlyMap<number, string>;
  /** Shards in an unfinished move recorded on this host: shard → the move. */
  readonly moving: ReadonlyMap<number, MovingShard>;
}

export interface MovingShard {
  readonly moveId: string;
  readonly source: string;
  readonly target: string;
  /** The last step the move recorded on this host. */
  readonly step: string;
  /** An abort of it began and was cut off: it can only be aborted again. */
  readonly aborting: boolean;
}

export interface ShardSchema {
  /** From the function's comment; null without a next_id(), 0 for one shardctl did not write. */
  readonly nextIdVersion: number | null;
}

export interface RecordedLayout {
  readonly controlVersion: number;
  readonly schemaPrefix: string;
  readonly shardCount: number;
  readonly epochMs: bigint;
  readonly shardBits: number;
  readonly sequenceBits: number;
}

/**
 * Two round trips: the catalog (does the control schema exist, which shard schemas, their
 * next_id), then the control schema. Rows come grouped (one per next_id version, per shard state,
 * per distinct set of applied migrations) and shards with the same applied set share one map: on
 * a current fleet of 8192 shards a host sends a handful of rows instead of tens of thousands, and
 * reading them does not dominate `migrate --check`.
 */
export async function readHostSnapshot(session: HostSession, config: ShardctlConfig): Promise<HostSnapshot> {
  const { client, host } = session;
  const prefix = config.schemaPrefix;
  try {
    const [tables, schemaRows, functionRows] = await simpleQuery(client, [
      `SELECT to_regclass(${quoteLiteral(`${CONTROL}.shards`)}) IS NOT NULL AS control, to_regclass(${quoteLiteral(`${CONTROL}.moves`)}) IS NOT NULL AS moves`,
      `SELECT ${numberList('n.oid', 'n.oid')} AS oids, ${numberList(`substr(n.nspname, length(${quoteLiteral(prefix)}) + 1)`, 'n.oid')} AS shards
         FROM pg_namespace n
        WHERE ${shardSchemaCondition('n.nspname', quoteLiteral(prefix))}`,
      // Every next_id(seq) in the database, grouped by the version in its comment (which also names the
      // shard), by schema oid: no join with pg_namespace, so the cost grows linearly with the shards.
      // An adopted shard's zero-argument next_id() (the published name, a wrapper) is not it.
      `SELECT d.description IS NOT NULL AS commented, substring(d.description FROM 'shardctl next_id v([0-9]+)') AS version,
              ${numberList('p.pronamespace')} AS schemas
         FROM pg_proc p
         LEFT JOIN pg_description d ON d.objoid = p.oid AND d.classoid = 'pg_proc'::regclass AND d.objsubid = 0
        WHERE p.proname = 'next_id' AND p.pronargs = 1
        GROUP BY 1, 2`,
    ]);
    const schemas = toSchemas(schemaRows![0] as { oids: string; shards: string }, functionRows as FunctionRow[]);
    const { control, moves } = tables![0] as { control: boolean; moves: boolean };
    if (!control) {
      return {
        host,
        serverVersion: session.serverVersion,
        serverVersionNum: session.serverVersionNum,
        layout: null,
        recorded: new Map(),
        schemas,
        applied: new Map(),
        appliedNames: new Map(),
        moving: new Map(),
      };
    }
    const [layoutRows, recordedRows, appliedRows, nameRows, movingRows] = await simpleQuery(client, [
      `SELECT control_version, schema_prefix, shard_count, epoch_ms, shard_bits, sequence_bits FROM ${CONTROL}.layout`,
      // The usual schema name (prefix + shard) is not sent for every shard, only the exceptions.
      `SELECT state, ${numberList('shard')} AS shards, NULL AS schema_name FROM ${CONTROL}.shards
        WHERE schema_name = ${quoteLiteral(prefix)} || shard GROUP BY state
       UNION ALL
       SELECT state, shard::text, schema_name FROM ${CONTROL}.shards
        WHERE schema_name IS DISTINCT FROM ${quoteLiteral(prefix)} || shard`,
      `SELECT versions, checksums, ${numberList('shard')} AS shards
         FROM (SELECT shard, array_agg(version ORDER BY version) AS versions, array_agg(checksum ORDER BY version) AS checksums
                 FROM ${CONTROL}.migrations GROUP BY shard) s
        GROUP BY versions, checksums`,
      `SELECT version, max(name) AS name FROM ${CONTROL}.migrations GROUP BY version`,
      ...(moves
        ? [
            `SELECT unnest(shards) AS shard, move_id, source, target, step, ${MOVE_ABORTING_SQL} FROM ${CONTROL}.moves WHERE status = 'running'`,
          ]
        : []),
    ]);
    return {
      host,
      serverVersion: session.serverVersion,
      serverVersionNum: session.serverVersionNum,
      layout: toLayout(layoutRows![0] as LayoutRow | undefined),
      recorded: toRecorded(recordedRows as RecordedRow[], prefix),
      schemas,
      applied: toApplied(appliedRows as AppliedRow[]),
      appliedNames: new Map((nameRows as { version: number; name: string }[]).map((r) => [r.version, r.name])),
      moving: new Map(
        (
          (movingRows ?? []) as {
            shard: number;
            move_id: string;
            source: string;
            target: string;
            step: string;
            aborting: boolean;
          }[]
        ).map((r) => [
          r.shard,
          { moveId: r.move_id, source: r.source, target: r.target, step: r.step, aborting: r.aborting },
        ]),
      ),
    };
  } catch (error) {
    if (error instanceof HostError) throw error;
    throw new HostError(host.name, `cannot read the catalog: ${describePgError(error)}`, { cause: error });
  }
}

/**
 * SQL: the values of an integer expression over the group as one comma-separated text ('' for
 * none). A text split in JavaScript costs a fraction of pg's parsing of an int[] of thousands.
 */
function numberList(expression: string, orderBy = expression): string {
  return `coalesce(string_agg((${expression})::text, ',' ORDER BY ${orderBy}), '')`;
}

export function parseNumberList(text: string): number[] {
  return text === '' ? [] : text.split(',').map(Number);
}

/** Several statements in one round trip (the simple protocol: no parameters); the rows of each. */
export async function simpleQuery(
  client: pg.Client | pg.PoolClient,
  statements: readonly string[],
): Promise<unknown[][]> {
  const result = (await client.query(statements.join(';\n'))) as unknown as pg.QueryResult | pg.QueryResult[];
  return (Array.isArray(result) ? result : [result]).map((r) => r.rows as unknown[]);
}

/**
 * SQL condition: `column` names a shard schema of the prefix (prefix + a shard number); `prefix` is
 * SQL text, the parameter $1 by default. Matched with left()/substr(), not LIKE: '_' is a LIKE
 * wildcard and a valid prefix character.
 */
export function shardSchemaCondition(column: string, prefix = '$1'): string {
  return `left(${column}, length(${prefix})) = ${prefix} AND substr(${column}, length(${prefix}) + 1) ~ '^(0|[1-9][0-9]{0,8})$'`;
}

/**
 * The invalid indexes no build is making now (what a CREATE INDEX CONCURRENTLY that was stopped
 * left: a killed run, a lock it gave up on), with their schemas and their names as SQL names them
 * (quoted where needed): of the one `schema`, or of every shard schema of `prefix`. At most 100, by
 * schema and name.
 */
export async function invalidIndexes(
  client: pg.Client,
  of: { readonly schema: string } | { readonly prefix: string },
): Promise<{ schema: string; name: string; qualified: string }[]> {
  const where = 'schema' in of ? 'n.nspname = $1' : shardSchemaCondition('n.nspname');
  const result = await client.query<{ schema: string; name: string; qualified: string }>(
    `SELECT n.nspname AS schema, c.relname AS name, format('%I.%I', n.nspname, c.relname) AS qualified
       FROM pg_catalog.pg_index i
       JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid
       JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
      WHERE NOT i.indisvalid AND ${where}
        AND NOT EXISTS (SELECT FROM pg_catalog.pg_stat_progress_create_index p WHERE p.index_relid = i.indexrelid)
      ORDER BY 1, 2 LIMIT 100`,
    ['schema' in of ? of.schema : of.prefix],
  );
  return result.rows;
}

interface FunctionRow {
  commented: boolean;
  version: string | null;
  schemas: string;
}

/** shard → its next_id version, for every shard schema; a schema holding several next_id takes the last row's. */
function toSchemas(
  namespaces: { oids: string; shards: string },
  functions: readonly FunctionRow[],
): Map<number, ShardSchema> {
  const shards = parseNumberList(namespaces.shards);
  const oids = parseNumberList(namespaces.oids);
  const shardOf = new Map(oids.map((oid, i) => [oid, shards[i]!]));
  const noFunction: ShardSchema = { nextIdVersion: null };
  const schemas = new Map<number, ShardSchema>(shards.map((shard) => [shard, noFunction]));
  for (const row of functions) {
    const value: ShardSchema = { nextIdVersion: functionVersion(row.commented, row.version) };
    for (const oid of parseNumberList(row.schemas)) {
      const shard = shardOf.get(oid);
      if (shard !== undefined) schemas.set(shard, value);
    }
  }
  return schemas;
}

/** The function comment carries `shardctl next_id vN`: a missing function or comment gives null, another comment 0. */
function functionVersion(commented: boolean, version: string | null): number | null {
  if (!commented) return null;
  return version === null ? 0 : Number(version);
}

interface LayoutRow {
  control_version: number;
  schema_prefix: string;
  shard_count: number;
  epoch_ms: string;
  shard_bits: number;
  sequence_bits: number;
}

function toLayout(row: LayoutRow | undefined): RecordedLayout | null {
  if (!row) return null;
  return {
    controlVersion: row.control_version,
    schemaPrefix: row.schema_prefix,
    shardCount: row.shard_count,
    epochMs: BigInt(row.epoch_ms),
    shardBits: row.shard_bits,
    sequenceBits: row.sequence_bits,
  };
}

interface RecordedRow {
  state: string;
  shards: string;
  /** Null for the group of shards whose schema has the usual name. */
  schema_name: string | null;
}

function toRecorded(rows: readonly RecordedRow[], prefix: string): Map<number, { schema: string; state: string }> {
  const recorded = new Map<number, { schema: string; state: string }>();
  for (const row of rows) {
    for (const shard of parseNumberList(row.shards))
      recorded.set(shard, { schema: row.schema_name ?? `${prefix}${shard}`, state: row.state });
  }
  return recorded;
}

interface AppliedRow {
  versions: number[];
  checksums: string[];
  shards: string;
}

/** shard → (version → checksum); shards with the same applied migrations share one (read-only) map. */
function toApplied(rows: readonly AppliedRow[]): Map<number, ReadonlyMap<number, string>> {
  const applied = new Map<number, ReadonlyMap<number, string>>();
  for (const row of rows) {
    const versions: ReadonlyMap<number, string> = new Map(
      row.versions.map((version, i) => [version, row.checksums[i]!]),
    );
    for (const shard of parseNumberList(row.shards)) applied.set(shard, versions);
  }
  return applied;
}

/** Size of a shard on its host: bytes on disk (tables, indexes, TOAST) and estimated rows. */
export interface ShardSize {
  readonly shard: number;
  readonly bytes: bigint;
  /**
   * From the planner's statistics: reltuples, or the live-tuple count where a table was never
   * analysed (-1). Not the larger of the two: n_live_tup can count a batch twice when an ANALYZE
   * lands before the inserting session reports its counts.
   */
  readonly rows: bigint;
}

/** Sizes of the shard schemas of a prefix on one host (all of them, or the listed shards). */
export async function readShardSizes(
  client: pg.Client,
  prefix: string,
  shards?: readonly number[],
): Promise<ShardSize[]> {
  return shardSizesQuery(client, prefix, shards, true);
}

/**
 * The estimated rows of the listed shards (ShardSize.rows), without their bytes: reading the sizes
 * of the files costs a stat call each (30 ms for 64 shards of 3 tables), the rows only the catalog.
 */
export async function readShardRows(
  client: pg.Client,
  prefix: string,
  shards: readonly number[],
): Promise<Map<number, bigint>> {
  const sizes = await shardSizesQuery(client, prefix, shards, false);
  return new Map(sizes.map((s) => [s.shard, s.rows]));
}

async function shardSizesQuery(
  client: pg.Client,
  prefix: string,
  shards: readonly number[] | undefined,
  bytes: boolean,
): Promise<ShardSize[]> {
  const tables = `c.relkind IN ('r', 'm')`;
  const result = await client.query<{ nspname: string; bytes: string; rows: string }>(
    `SELECT n.nspname,
            ${bytes ? `coalesce(sum(pg_total_relation_size(c.oid)) FILTER (WHERE ${tables}), 0)` : '0'}::text AS bytes,
            coalesce(sum(CASE WHEN c.reltuples >= 0 THEN c.reltuples ELSE pg_stat_get_live_tuples(c.oid) END) FILTER (WHERE ${tables}), 0)::bigint::text AS rows
       FROM pg_namespace n
       LEFT JOIN pg_class c ON c.relnamespace = n.oid
      WHERE ${shardSchemaCondition('n.nspname')}
        AND ($2::text[] IS NULL OR n.nspname = ANY($2::text[]))
      GROUP BY n.nspname`,
    [prefix, shards ? shards.map((s) => `${prefix}${s}`) : null],
  );
  return result.rows
    .map((r) => ({ shard: Number(r.nspname.slice(prefix.length)), bytes: BigInt(r.bytes), rows: BigInt(r.rows) }))
    .sort((a, b) => a.shard - b.shard);
}

/** A column whose default is a shard's next_id(), with the sequence it draws from. */
interface IdDefaultRow {
  schema: string;
  table: string;
  column: string;
  seq_schema: string;
  seq: string;
  fn_schema: string;
}

/**
 * The largest ids are read by statements of ID_CHECK_UNION columns each (a statement's planning time
 * grows faster than its number of branches: 500 branches took 7x as long as 25 statements of 20),
 * ID_CHECK_STATEMENTS statements per round trip.
 */
const ID_CHECK_UNION = 20;
const ID_CHECK_STATEMENTS = 50;

/**
 * The id sequences of a host's shard schemas that next_id() would reuse ids from, as messages naming
 * the shard and the table: a sequence whose next position is at or below the position of the
 * largest id already in the table (moved back with setval(): next_id only ever moves
 * a sequence forwards, so it would hand out those positions again), and a default that draws from
 * another schema's sequence or calls another schema's next_id() (ids of one shard from the
 * position of another). One catalog query, then one round trip per
 * ID_CHECK_UNION * ID_CHECK_STATEMENTS such columns; each largest id is read along an index on the
 * column when there is one.
 */
export async function sequenceProblems(
  client: pg.Client,
  config: ShardctlConfig,
  /** Shards not to check: copies arriving by a move, whose sequences the move carries at its switch. */
  skipShards: ReadonlySet<number> = new Set(),
): Promise<string[]> {
  const prefix = config.schemaPrefix;
  const defaults = await client.query<IdDefaultRow>(
    `SELECT n.nspname AS schema, c.relname AS table, a.attname AS column, sn.nspname AS seq_schema, s.relname AS seq, pn.nspname AS fn_schema
       FROM pg_attrdef d
       JOIN pg_class c ON c.oid = d.adrelid AND c.relkind IN ('r', 'p') AND NOT c.relispartition
       JOIN pg_namespace n ON n.oid = c.relnamespace
       JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
       JOIN pg_depend fd ON fd.classid = 'pg_attrdef'::regclass AND fd.objid = d.oid AND fd.refclassid = 'pg_proc'::regclass
       JOIN pg_proc p ON p.oid = fd.refobjid AND p.proname = 'next_id'
       JOIN pg_namespace pn ON pn.oid = p.pronamespace
       JOIN pg_depend sd ON sd.classid = 'pg_attrdef'::regclass AND sd.objid = d.oid AND sd.refclassid = 'pg_class'::regclass
       JOIN pg_class s ON s.oid = sd.refobjid AND s.relkind = 'S'
       JOIN pg_namespace sn ON sn.oid = s.relnamespace
      WHERE ${shardSchemaCondition('n.nspname')}
      ORDER BY 1, 2, 3`,
    [prefix],
  );
  const problems: string[] = [];
  const { shardBits, sequenceBits } = config.idLayout;
  const sequenceMask = (1n << BigInt(sequenceBits)) - 1n;
  const rows = defaults.rows.filter((row) => !skipShards.has(Number(row.schema.slice(prefix.length))));
  for (const row of rows) {
    const where = `shard ${row.schema.slice(prefix.length)}, table ${row.schema}.${row.table}`;
    if (row.seq_schema !== row.schema) {
      problems.push(
        `${where}: ${row.column} draws from sequence ${row.seq_schema}.${row.seq} of another schema; its ids can repeat that shard's`,
      );
    } else if (row.fn_schema !== row.schema) {
      problems.push(
        `${where}: ${row.column} calls ${row.fn_schema}.next_id(), another shard's; its ids carry that shard's number`,
      );
    }
  }
  const statements: string[] = [];
  for (let start = 0; start < rows.length; start += ID_CHECK_UNION) {
    statements.push(
      rows
        .slice(start, start + ID_CHECK_UNION)
        .map(
          (row, i) =>
            `SELECT ${start + i} AS i, (SELECT max(${quoteIdent(row.column)}) FROM ${quoteIdent(row.schema)}.${quoteIdent(row.table)})::text AS max_id, ` +
            `last_value::text AS last_value, is_called FROM ${quoteIdent(row.seq_schema)}.${quoteIdent(row.seq)}`,
        )
        .join('\nUNION ALL\n'),
    );
  }
  for (let start = 0; start < statements.length; start += ID_CHECK_STATEMENTS) {
    const results = await simpleQuery(client, statements.slice(start, start + ID_CHECK_STATEMENTS));
    for (const r of results.flat() as { i: number; max_id: string | null; last_value: string; is_called: boolean }[]) {
      if (r.max_id === null) continue;
      const row = rows[r.i]!;
      const id = BigInt(r.max_id);
      const position = ((id >> BigInt(shardBits + sequenceBits)) << BigInt(sequenceBits)) | (id & sequenceMask);
      const next = BigInt(r.last_value) + (r.is_called ? 1n : 0n);
      if (next > position) continue;
      problems.push(
        `shard ${row.schema.slice(prefix.length)}, table ${row.schema}.${row.table}: sequence ${row.seq_schema}.${row.seq} is behind the ids in ${row.column} ` +
          `(next position ${next}, largest id ${id} is at position ${position}): next_id would hand out ids again. ` +
          `Move it forward: SELECT setval(${quoteLiteral(`${quoteIdent(row.seq_schema)}.${quoteIdent(row.seq)}`)}, ${position})`,
      );
    }
  }
  return problems;
}
