import type pg from 'pg';
import type { HostConfig, ShardctlConfig } from '../config/types.js';
import type { NextIdLanguage } from '../id/sql.js';
import { HostError } from '../errors.js';
import { describePgError } from './connect.js';
import { CONTROL, controlTableExists } from './control.js';
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
}

export interface ShardSchema {
  /** From the function's comment; null without a next_id(), 0 for one shardctl did not write. */
  readonly nextIdVersion: number | null;
  /** The language next_id() is written in (an upgrade keeps it; see sql/next_id_wrapper_plpgsql.sql). */
  readonly nextIdLanguage: NextIdLanguage | null;
}

export interface RecordedLayout {
  readonly controlVersion: number;
  readonly schemaPrefix: string;
  readonly shardCount: number;
  readonly epochMs: bigint;
  readonly shardBits: number;
  readonly sequenceBits: number;
}

export async function readHostSnapshot(session: HostSession, config: ShardctlConfig): Promise<HostSnapshot> {
  const { client, host } = session;
  try {
    const control = await controlTableExists(client, 'shards');
    const schemas = await readShardSchemas(client, config.schemaPrefix);
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
    // One client runs one query at a time: sequential on purpose.
    const layout = await readLayout(client);
    const recorded = await readRecordedShards(client);
    const moving = await readMovingShards(client);
    const { applied, names } = await readApplied(client);
    return {
      host,
      serverVersion: session.serverVersion,
      serverVersionNum: session.serverVersionNum,
      layout,
      recorded,
      schemas,
      applied,
      appliedNames: names,
      moving,
    };
  } catch (error) {
    if (error instanceof HostError) throw error;
    throw new HostError(host.name, `cannot read the catalog: ${describePgError(error)}`, { cause: error });
  }
}

/**
 * SQL condition: `column` names a shard schema of the prefix passed as $1 (prefix + a shard number).
 * Matched with left()/substr(), not LIKE: '_' is a LIKE wildcard and a valid prefix character.
 */
export function shardSchemaCondition(column: string): string {
  return `left(${column}, length($1)) = $1 AND substr(${column}, length($1) + 1) ~ '^(0|[1-9][0-9]{0,8})$'`;
}

async function readShardSchemas(client: pg.Client, prefix: string): Promise<Map<number, ShardSchema>> {
  const result = await client.query<{ nspname: string; comment: string | null; lanname: string | null }>(
    `SELECT n.nspname, obj_description(p.oid, 'pg_proc') AS comment, l.lanname
       FROM pg_namespace n
       LEFT JOIN pg_proc p ON p.pronamespace = n.oid AND p.proname = 'next_id'
       LEFT JOIN pg_language l ON l.oid = p.prolang
      WHERE ${shardSchemaCondition('n.nspname')}`,
    [prefix],
  );
  const map = new Map<number, ShardSchema>();
  for (const row of result.rows) {
    const shard = Number(row.nspname.slice(prefix.length));
    map.set(shard, { nextIdVersion: parseFunctionVersion(row.comment), nextIdLanguage: row.lanname === 'plpgsql' ? 'plpgsql' : row.lanname === null ? null : 'sql' });
  }
  return map;
}

/** The function comment carries `shardctl next_id vN`; a missing function or comment gives null. */
function parseFunctionVersion(comment: string | null): number | null {
  if (comment === null) return null;
  const match = /shardctl next_id v(\d+)/.exec(comment);
  return match ? Number(match[1]) : 0;
}

async function readLayout(client: pg.Client): Promise<RecordedLayout | null> {
  const result = await client.query<{
    control_version: number;
    schema_prefix: string;
    shard_count: number;
    epoch_ms: string;
    shard_bits: number;
    sequence_bits: number;
  }>(`SELECT control_version, schema_prefix, shard_count, epoch_ms, shard_bits, sequence_bits FROM ${CONTROL}.layout`);
  const row = result.rows[0];
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

async function readMovingShards(client: pg.Client): Promise<Map<number, MovingShard>> {
  if (!(await controlTableExists(client, 'moves'))) return new Map();
  const result = await client.query<{ shard: number; move_id: string; source: string; target: string }>(
    `SELECT unnest(coalesce(shards, ARRAY[shard])) AS shard, move_id, source, target FROM ${CONTROL}.moves WHERE status = 'running'`,
  );
  return new Map(result.rows.map((r) => [r.shard, { moveId: r.move_id, source: r.source, target: r.target }]));
}

async function readRecordedShards(client: pg.Client): Promise<Map<number, { schema: string; state: string }>> {
  const result = await client.query<{ shard: number; schema_name: string; state: string }>(
    `SELECT shard, schema_name, state FROM ${CONTROL}.shards`,
  );
  return new Map(result.rows.map((r) => [r.shard, { schema: r.schema_name, state: r.state }]));
}

async function readApplied(client: pg.Client): Promise<{ applied: Map<number, Map<number, string>>; names: Map<number, string> }> {
  const result = await client.query<{ shard: number; version: number; checksum: string; name: string }>(
    `SELECT shard, version, checksum, name FROM ${CONTROL}.migrations`,
  );
  const applied = new Map<number, Map<number, string>>();
  const names = new Map<number, string>();
  for (const row of result.rows) {
    let versions = applied.get(row.shard);
    if (!versions) applied.set(row.shard, (versions = new Map()));
    versions.set(row.version, row.checksum);
    names.set(row.version, row.name);
  }
  return { applied, names };
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
export async function readShardSizes(client: pg.Client, prefix: string, shards?: readonly number[]): Promise<ShardSize[]> {
  const result = await client.query<{ nspname: string; bytes: string; rows: string }>(
    `SELECT n.nspname,
            coalesce(sum(pg_total_relation_size(c.oid)) FILTER (WHERE c.relkind IN ('r', 'm')), 0)::text AS bytes,
            coalesce(sum(CASE WHEN c.reltuples >= 0 THEN c.reltuples ELSE coalesce(s.n_live_tup, 0) END) FILTER (WHERE c.relkind IN ('r', 'm')), 0)::bigint::text AS rows
       FROM pg_namespace n
       LEFT JOIN pg_class c ON c.relnamespace = n.oid
       LEFT JOIN pg_stat_all_tables s ON s.relid = c.oid
      WHERE ${shardSchemaCondition('n.nspname')}
        AND ($2::text[] IS NULL OR n.nspname = ANY($2::text[]))
      GROUP BY n.nspname`,
    [prefix, shards ? shards.map((s) => `${prefix}${s}`) : null],
  );
  return result.rows
    .map((r) => ({ shard: Number(r.nspname.slice(prefix.length)), bytes: BigInt(r.bytes), rows: BigInt(r.rows) }))
    .sort((a, b) => a.shard - b.shard);
}
