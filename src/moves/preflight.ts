import { constants } from 'node:fs';
import { access } from 'node:fs/promises';
import { dirname } from 'node:path';
import type pg from 'pg';
import type { ShardctlConfig } from '../config/types.js';
import { hostForShard, shardSchemaName } from '../config/types.js';
import type { MigrationFile } from '../migrations/files.js';
import { CONTROL } from '../fleet/control.js';
import { dropSubscriptionSql, probeSubscriptionSql } from './sql.js';
import { controlTableExists } from '../fleet/control.js';
import type { HostSession } from '../fleet/session.js';
import { shardDrift } from '../migrations/rules.js';
import type { MoveMode } from './state.js';

export interface PreflightCheck {
  readonly name: string;
  readonly ok: boolean;
  /** What was found, and when not ok, what to change. */
  readonly message: string;
}

export interface PreflightInput {
  readonly config: ShardctlConfig;
  readonly shard: number;
  readonly mode: MoveMode;
  readonly source: HostSession;
  readonly target: HostSession;
  readonly migrations: readonly MigrationFile[];
  /** Create and drop a disabled subscription on the target to prove it can reach the source. */
  readonly probeReachability: boolean;
  /** The config file the switch rewrites; it must be writable before anything changes. */
  readonly configFile: string;
}

/**
 * Everything checked before a move changes anything. Each failed check says what to change.
 */
export async function preflight(input: PreflightInput): Promise<PreflightCheck[]> {
  const { config, shard, mode } = input;
  const [source, target] = [input.source.host, input.target.host];
  const [src, dst] = [input.source.client, input.target.client];
  const schema = shardSchemaName(config, shard);
  const checks: PreflightCheck[] = [];
  const add = (name: string, ok: boolean, message: string): void => {
    checks.push({ name, ok, message });
  };

  add('map', hostForShard(config, shard)?.name === source.name, `the map puts shard ${shard} on ${source.name}`);
  add('target', target.name !== source.name, target.name === source.name ? `shard ${shard} is already on ${target.name}` : `target ${target.name} is in the map`);

  const onSource = await src.query<{ exists: boolean; state: string | null }>(
    `SELECT to_regnamespace($1) IS NOT NULL AS exists,
            (SELECT state FROM ${CONTROL}.shards WHERE shard = $2) AS state`,
    [schema, shard],
  );
  const sourceRow = onSource.rows[0]!;
  add(
    'shard on source',
    sourceRow.exists && sourceRow.state === 'active',
    sourceRow.exists
      ? sourceRow.state === 'active'
        ? `schema ${schema} exists on ${source.name} and is active`
        : `schema ${schema} on ${source.name} is ${sourceRow.state ?? 'not recorded by shardctl'}; run shardctl init first`
      : `schema ${schema} does not exist on ${source.name}; nothing to move`,
  );

  const targetInitialised = await controlTableExists(dst, 'shards');
  const onTarget = await dst.query<{ exists: boolean; state: string | null }>(
    `SELECT to_regnamespace($1) IS NOT NULL AS exists, ${
      targetInitialised ? `(SELECT state FROM ${CONTROL}.shards WHERE shard = $2)` : 'NULL::text'
    } AS state`,
    targetInitialised ? [schema, shard] : [schema],
  );
  const targetRow = onTarget.rows[0]!;
  add(
    'target free',
    !targetRow.exists && targetRow.state === null,
    targetRow.state === 'fenced'
      ? `${target.name} still holds an old fenced copy of shard ${shard}; remove it with shardctl gc first`
      : targetRow.state !== null
        ? `${target.name} already records shard ${shard} (${targetRow.state}); finish or undo the move that put it there (move-shard --resume / --abort), or drop it`
        : targetRow.exists
          ? `schema ${schema} already exists on ${target.name}; drop it (or shardctl move-shard --abort an earlier move)`
          : `no schema ${schema} on ${target.name}`,
  );
  add(
    'target initialised',
    targetInitialised,
    targetInitialised ? `${target.name} has the shardctl control schema` : `${target.name} has no shardctl control schema; run shardctl init first`,
  );

  const versions = [
    { num: input.source.serverVersionNum, text: input.source.serverVersion },
    { num: input.target.serverVersionNum, text: input.target.serverVersion },
  ] as const;
  if (mode === 'online') {
    add(
      'versions',
      versions.every((v) => v.num >= 150000),
      `PostgreSQL ${versions[0].text} on ${source.name}, ${versions[1].text} on ${target.name}` +
        (versions.every((v) => v.num >= 150000) ? '' : '; online mode needs 15 or later on both (use --mode offline)'),
    );
    const settings = await src.query<{ wal_level: string; free_slots: number; free_senders: number }>(
      `SELECT current_setting('wal_level') AS wal_level,
              current_setting('max_replication_slots')::int - (SELECT count(*) FROM pg_replication_slots)::int AS free_slots,
              current_setting('max_wal_senders')::int - (SELECT count(*) FROM pg_stat_replication)::int AS free_senders`,
    );
    const s = settings.rows[0]!;
    add(
      'wal_level',
      s.wal_level === 'logical',
      s.wal_level === 'logical'
        ? `wal_level=logical on ${source.name}`
        : `wal_level=${s.wal_level} on ${source.name}; set wal_level=logical and restart it, or use --mode offline`,
    );
    add(
      'replication slots',
      s.free_slots > 0 && s.free_senders > 0,
      `${s.free_slots} free replication slots and ${s.free_senders} free WAL senders on ${source.name}` +
        (s.free_slots > 0 && s.free_senders > 0 ? '' : '; raise max_replication_slots / max_wal_senders'),
    );
    const noIdentity = await src.query<{ relname: string }>(
      `SELECT c.relname FROM pg_class c
        WHERE c.relnamespace = to_regnamespace($1) AND c.relkind = 'r'
          AND (c.relreplident = 'n'
               OR (c.relreplident = 'd' AND NOT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary)))
        ORDER BY 1`,
      [schema],
    );
    const tables = noIdentity.rows.map((r) => r.relname);
    add(
      'replica identity',
      tables.length === 0,
      tables.length === 0
        ? `every table of ${schema} has a replica identity`
        : `table${tables.length === 1 ? '' : 's'} ${tables.join(', ')} in ${schema} ha${tables.length === 1 ? 's' : 've'} no replica identity; add a primary key or ALTER TABLE … REPLICA IDENTITY FULL, or use --mode offline`,
    );
    if (input.probeReachability) {
      const reach = await probeSubscription(dst, source.replicationUrl);
      add(
        'target reaches source',
        reach === null,
        reach === null
          ? `${target.name} can connect to ${source.name} for replication`
          : `${target.name} cannot connect to ${source.name} at its replicationUrl: ${reach}; set hosts[].replicationUrl to an address ${target.name} can reach`,
      );
    } else {
      add('target reaches source', true, 'not probed in --dry-run (it would create and drop a subscription)');
    }
  } else {
    add('versions', true, `PostgreSQL ${versions[0].text} on ${source.name}, ${versions[1].text} on ${target.name}`);
  }

  const writable = await canRewrite(input.configFile);
  add(
    'config file',
    writable === null,
    writable === null
      ? `${input.configFile} will be rewritten at the switch`
      : `the map cannot be rewritten at the switch: ${writable}; the move would be stuck after the target went live`,
  );

  const [srcMove, dstMove] = await Promise.all([runningMoveId(src, shard), runningMoveId(dst, shard)]);
  const running = srcMove ?? dstMove;
  add(
    'no other move',
    running === null,
    running === null ? `no move of shard ${shard} is running` : `move ${running} of shard ${shard} is unfinished; finish it with --resume or undo it with --abort`,
  );

  const applied = await src.query<{ version: number; checksum: string }>(
    `SELECT version, checksum FROM ${CONTROL}.migrations WHERE shard = $1 ORDER BY version`,
    [shard],
  );
  const drift = shardDrift(new Map(applied.rows.map((r) => [r.version, r.checksum])), input.migrations);
  add(
    'migrations',
    drift.length === 0,
    drift.length === 0
      ? `shard ${shard} is at migration level ${applied.rows.at(-1)?.version ?? 0}; the same files will build the target`
      : `migration version${drift.length === 1 ? '' : 's'} ${drift.join(', ')} applied to shard ${shard} ${drift.length === 1 ? 'has' : 'have'} no matching file (changed or deleted); restore them first`,
  );
  return checks;
}

/** Null when the file and its folder (for the atomic rename) are writable; else why not. */
async function canRewrite(file: string): Promise<string | null> {
  if (file === '<inline>') return 'the config was not read from a file (pass configFile)';
  try {
    await access(file, constants.R_OK | constants.W_OK);
    await access(dirname(file), constants.W_OK);
    return null;
  } catch (error) {
    return (error as Error).message;
  }
}

async function runningMoveId(client: pg.Client, shard: number): Promise<string | null> {
  if (!(await controlTableExists(client, 'moves'))) return null;
  const r = await client.query<{ move_id: string }>(`SELECT move_id FROM ${CONTROL}.moves WHERE shard = $1 AND status = 'running'`, [shard]);
  return r.rows[0]?.move_id ?? null;
}

/** Null when the target could open a replication connection to the source; else the error. */
async function probeSubscription(target: pg.Client, sourceUrl: string): Promise<string | null> {
  const name = `shardctl_probe_${process.pid}`;
  try {
    await target.query(probeSubscriptionSql(name, sourceUrl));
    await target.query(dropSubscriptionSql(name));
    return null;
  } catch (error) {
    await target.query(dropSubscriptionSql(name, { ifExists: true })).catch(() => undefined);
    return (error as Error).message;
  }
}
