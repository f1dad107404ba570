import pg from 'pg';
import { shardsPhrase } from '../config/ranges.js';
import { shardSchemaName } from '../config/types.js';
import { HostError } from '../errors.js';
import { describePgError } from '../fleet/connect.js';
import { WORKER_TRANSACTION_SQL, DURABLE_FLUSH_SQL } from '../fleet/control.js';
import { createShardSql, dropShardSql } from '../fleet/sql.js';
import { migrationSql, noTransactionMigrationSteps } from '../migrations/sql.js';
import { privilegeVersions, syncPrivilegesSql, withheldSchemaAcl, type PrivilegeObject } from './privileges.js';
import { APPLIED_VERSIONS_SQL } from './sql/control.js';
import { groupBySchema, shardPrivileges, EXISTING_SCHEMAS_SQL } from './catalog.js';
import { type MoveContext, notice, schemasOf } from './context.js';
import { concurrency, CREATE_WORKER_SESSION_SQL, Workers } from './workers.js';
import { stopDeltas, stopTracking } from './tail.js';
import { faultAfter } from './state.js';
import { rollbackQuietly, runTransaction } from '../pg/quiet.js';
import { DELETE_CHUNKS_SQL } from './chunks.js';
import {
  HELD_BEFORE_SQL,
  BUILDING_LOCAL_SQL,
  BUILDING_SESSION_SQL,
  incomingGuardFunctionSql,
  incomingGuardsSql,
  RESET_BUILDING_SQL,
} from './sql/incoming.js';

/**
 * The target's copies of a move's shards: built at the source's migration level with the source's
 * owners and grants (createTargets), and dropped again by the undo (dropTargets).
 */

/**
 * Every shard's schema on the target, at the source's migration level for that shard, marked
 * incoming, with the source's owners and grants (carryPrivileges). With `onChunk` (createAndCopy)
 * the shards are built in chunks, and each chunk is handed over once it has its owners and grants,
 * while the next is being built; onChunk returning false stops the building (the copy failed).
 */
export async function createTargets(ctx: MoveContext, onChunk?: (shards: readonly number[]) => boolean): Promise<void> {
  const { source, target } = ctx;
  const schemas = schemasOf(ctx, ctx.shards);
  // Guarded: the copies of shards this host held before (sql/incoming.ts).
  const guarded = await heldBefore(ctx);
  // The source's owners and grants are read once for every chunk (each read scans the catalog
  // whole), by this run's preflight if it had one.
  const [applied, left, wanted] = await Promise.all([
    source.client.query<{ shard: number; version: number }>(APPLIED_VERSIONS_SQL, [ctx.shards]),
    targetWork(ctx, ctx.shards, guarded),
    ctx.sourcePrivileges ?? shardPrivileges(source.client, schemas),
  ]);
  const work = left(applied.rows);
  const wantedBySchema = groupBySchema(wanted, (o) => o.schema);
  // The guard's functions before any copy is built.
  if (guarded.size > 0) await target.client.query(incomingGuardFunctionSql(ctx.moveId));
  const workers = new Workers(ctx, target);
  // The privileges of a chunk are carried on the move's own session while the workers build the
  // next; a failure there, or a copy that stopped, ends the building.
  let carried: Promise<void> = Promise.resolve();
  let stop = false;
  try {
    const chunks = onChunk ? chunksOf(ctx.shards, CREATE_CHUNKS, concurrency(ctx, ctx.shards.length)) : [ctx.shards];
    for (const [i, chunk] of chunks.entries()) {
      if (stop) break;
      const inChunk = new Set(chunk);
      await workers.run(
        roundTrips(work.filter((w) => inChunk.has(w.shard) && w.statements.length > 0)),
        (client, group) => migrateTargets(ctx, client, group, applied.rows, guarded),
      );
      if (i === 0) faultAfter('target-migrations');
      carried = carried.then(async () => {
        // Copies built by an earlier run, or by a no-transaction migration, guarded too.
        const guarding = chunk.filter((shard) => guarded.has(shard));
        if (guarding.length > 0)
          await target.client.query(
            incomingGuardsSql(
              ctx.moveId,
              guarding.map((shard) => ({ shard, schema: shardSchemaName(ctx.config, shard) })),
              source.host.name,
            ),
          );
        await carryPrivileges(ctx, chunk, wantedBySchema, guarded);
        if (onChunk && !onChunk(chunk)) stop = true;
      });
      // Seen where it is awaited, after the last chunk.
      carried.catch(() => (stop = true));
    }
    await carried;
  } catch (error) {
    // A chunk's migrations failed: the carry still running on the move's session ends first.
    await carried.catch(() => undefined);
    throw error;
  } finally {
    await workers.close();
  }
  // The workers committed without waiting for the WAL flush: made durable before the step is recorded.
  await runTransaction(target.client, DURABLE_FLUSH_SQL);
}

/**
 * The move's shards that the target held before: a move of its own took them elsewhere (its
 * records of moves are kept). Only there can a client's map still place a shard on this host, so
 * only their incoming copies are guarded (sql/incoming.ts); a fleet-scale move of shards new to
 * the host gives none of its tables a trigger (bench move-fleet: 12-25% slower when every table
 * had one).
 */
export async function heldBefore(ctx: MoveContext): Promise<ReadonlySet<number>> {
  if (ctx.guarded) return ctx.guarded;
  const rows = await ctx.target.client.query<{ shard: number }>(HELD_BEFORE_SQL, [ctx.target.host.name, ctx.shards]);
  ctx.guarded = new Set(rows.rows.map((r) => r.shard));
  return ctx.guarded;
}

/** What is left to build of one shard's copy on the target: its statements, in order. */
interface TargetWork {
  readonly shard: number;
  readonly statements: readonly string[];
}

/**
 * What is left to build of `shards` on the target, read from the target's catalog and records
 * (a resumed move, or a group retried shard by shard, skips what committed): returned as a function
 * of the source's applied versions, so that the reads of both hosts run at once.
 */
async function targetWork(
  ctx: MoveContext,
  shards: readonly number[],
  guarded: ReadonlySet<number>,
  client: pg.Client = ctx.target.client,
): Promise<(applied: readonly { shard: number; version: number }[]) => TargetWork[]> {
  const { config, source } = ctx;
  const [existing, done] = await Promise.all([
    client.query<{ nspname: string }>(EXISTING_SCHEMAS_SQL, [schemasOf(ctx, shards)]),
    client.query<{ shard: number; version: number }>(APPLIED_VERSIONS_SQL, [shards]),
  ]);
  const files = new Map(ctx.migrations.map((m) => [m.version, m]));
  const exists = new Set(existing.rows.map((r) => r.nspname));
  const have = new Set(done.rows.map((r) => `${r.shard}:${r.version}`));
  return (applied) => {
    const versionsOf = new Map<number, number[]>();
    for (const { shard, version } of applied) versionsOf.set(shard, [...(versionsOf.get(shard) ?? []), version]);
    return shards.map((shard) => {
      const statements: string[] = [];
      const schema = shardSchemaName(config, shard);
      // Each table is guarded in the transaction that creates it (sql/incoming.ts): a client on an
      // old map that places the shard here never writes into the copy.
      // The move's own writes pass it (its migrations' seed rows).
      const guard = guarded.has(shard) ? [incomingGuardsSql(ctx.moveId, [{ shard, schema }], source.host.name)] : [];
      const building = guard.length > 0;
      if (!exists.has(schema)) statements.push(createShardSql(config, shard, true, 'incoming'));
      for (const version of versionsOf.get(shard) ?? []) {
        if (have.has(`${shard}:${version}`)) continue;
        const file = files.get(version);
        if (!file) {
          throw new HostError(
            source.host.name,
            `migration version ${version} is applied but has no file; restore it and resume the move`,
            { shard, code: 'MIGRATION_DRIFT', next: [{ action: 'resume', shards: ctx.shards }] },
          );
        }
        if (file.noTransaction)
          statements.push(
            ...(building ? [BUILDING_SESSION_SQL] : []),
            ...noTransactionMigrationSteps(config, shard, file, { session: CREATE_WORKER_SESSION_SQL }),
            ...(building ? [RESET_BUILDING_SQL] : []),
            ...guard.map((g) => ['BEGIN;', g, 'COMMIT;'].join('\n')),
          );
        else
          statements.push(
            migrationSql(config, shard, file, {
              start: building ? [BUILDING_LOCAL_SQL] : [],
              end: guard,
              session: CREATE_WORKER_SESSION_SQL,
            }),
          );
      }
      return { shard, statements };
    });
  };
}

/**
 * The shards' copies sent several per round trip (ROUND_TRIP_SHARDS), each shard's transactions
 * whole, so each commits its DDL with its records as when sent alone; a shard with a no-transaction
 * step goes alone.
 */
export function roundTrips<T extends TargetWork>(work: readonly T[], size = ROUND_TRIP_SHARDS): T[][] {
  const groups: T[][] = [];
  const group: T[] = [];
  for (const w of work) {
    if (!w.statements.every(inTransaction)) {
      groups.push([w]);
      continue;
    }
    group.push(w);
    if (group.length >= size) groups.push(group.splice(0));
  }
  if (group.length > 0) groups.push(group);
  return groups;
}

/**
 * Target shards per round trip: the creation's time is the servers' DDL, but on a machine where
 * the hosts and the CLIs share the cores every round trip also waits for a worker to be scheduled.
 */
const ROUND_TRIP_SHARDS = 4;

function inTransaction(sql: string): boolean {
  return sql.startsWith('BEGIN;');
}

/**
 * A group of shards' copies in one round trip. A failure stops the rest of the text: the shards
 * whose transactions committed stay built, and the group is retried shard by shard from what the
 * target holds (targetWork), so the error names its shard and a transient failure does not fail
 * the move.
 */
async function migrateTargets(
  ctx: MoveContext,
  client: pg.Client,
  group: readonly TargetWork[],
  applied: readonly { shard: number; version: number }[],
  guarded: ReadonlySet<number>,
): Promise<void> {
  if (group.length === 1) return migrateTarget(ctx, client, group[0]!.shard, group[0]!.statements);
  const shards = group.map((w) => w.shard);
  try {
    await client.query(group.flatMap((w) => w.statements).join('\n'));
    return;
  } catch (error) {
    await rollbackQuietly(client);
    notice(
      ctx,
      `host ${ctx.target.host.name}: the copies of ${shardsPhrase(shards)} sent together failed (${describePgError(error)}); building them one by one`,
    );
  }
  // Read on the worker's own connection: the move's session may be inside a transaction of the
  // privileges' carry (createTargets) meanwhile.
  const left = (await targetWork(ctx, shards, guarded, client))(applied.filter((a) => shards.includes(a.shard)));
  for (const { shard, statements } of left)
    if (statements.length > 0) await migrateTarget(ctx, client, shard, statements);
}

/** Online, the copy starts on the first chunk of target shards while the next ones are built (createTargets). */
const CREATE_CHUNKS = 8;

/**
 * `list` in `count` chunks (fewer for a short list), in order, the last one split in halves down to
 * `least` items (the workers building it): the copy of the last chunk is what is left once the
 * creation ends, so it is kept short.
 */
export function chunksOf<T>(list: readonly T[], count: number, least = 1): T[][] {
  const size = Math.max(1, Math.ceil(list.length / count));
  const chunks: T[][] = [];
  for (let i = 0; i < list.length; i += size) chunks.push(list.slice(i, i + size));
  const last = chunks.pop() ?? [];
  while (last.length >= 2 * Math.max(1, least)) chunks.push(last.splice(0, Math.ceil(last.length / 2)));
  if (last.length > 0) chunks.push(last);
  return chunks;
}

/** One shard's creation and migrations: whole transactions in one round trip when they can share one; no-transaction steps alone. */
async function migrateTarget(
  ctx: MoveContext,
  client: pg.Client,
  shard: number,
  statements: readonly string[],
): Promise<void> {
  const batch: string[] = [];
  const flush = async (): Promise<void> => {
    if (batch.length > 0) await client.query(batch.splice(0).join('\n'));
  };
  try {
    for (const sql of statements) {
      if (sql.startsWith('BEGIN;')) batch.push(sql);
      else {
        await flush();
        await client.query(sql);
      }
    }
    await flush();
  } catch (error) {
    await rollbackQuietly(client);
    throw new HostError(ctx.target.host.name, `cannot create the target copy: ${describePgError(error)}`, {
      shard,
      code: 'MOVE_FAILED',
      cause: error,
    });
  }
}

/**
 * The source's owners, ACLs and default privileges (`wantedBySchema`, as the preflight or
 * createTargets read them) given to the target's copies of `shards` (a guarded copy's schema to its
 * owner alone until the switch: privileges.ts withheldSchemaAcl), one transaction per shard
 * whose copy differs (none when the same role built both and nothing was granted by hand), on the
 * move's session, each committed without waiting for the WAL flush (the caller's flush covers
 * them). After the migrations: what to change depends on what the migrations built, read from the
 * target's catalog. Run on every attempt, so a run killed between the migrations and this still
 * carries them on --resume; the copies are incoming, so no client sees them before.
 */
async function carryPrivileges(
  ctx: MoveContext,
  shards: readonly number[],
  wantedBySchema: ReadonlyMap<string, readonly PrivilegeObject[]>,
  guarded: ReadonlySet<number>,
): Promise<void> {
  const { source, target } = ctx;
  const current = await shardPrivileges(target.client, schemasOf(ctx, shards));
  const currentBySchema = groupBySchema(current, (o) => o.schema);
  const versions = privilegeVersions(source.serverVersionNum, target.serverVersionNum);
  for (const shard of shards) {
    const schema = shardSchemaName(ctx.config, shard);
    const sourceObjects = wantedBySchema.get(schema) ?? [];
    const wanted = guarded.has(shard) ? withheldSchemaAcl(sourceObjects) : sourceObjects;
    const statements = syncPrivilegesSql(wanted, currentBySchema.get(schema) ?? [], versions);
    if (statements.length === 0) continue;
    try {
      await runTransaction(target.client, ['BEGIN;', WORKER_TRANSACTION_SQL, ...statements, 'COMMIT;'].join('\n'));
    } catch (error) {
      throw new HostError(
        target.host.name,
        `cannot give the target copy the source's owners and grants: ${describePgError(error)}`,
        { shard, code: 'MOVE_FAILED', cause: error },
      );
    }
  }
}

/**
 * createTargets' undo (abortMove): the target's copies dropped, only those this move created
 * (incoming, never active: abortMove refuses a move that activated any). The tracking of the
 * fence's verification sits on these copies, so it goes with them; its rows are removed after them,
 * where no trigger is left to drop.
 */
export async function dropTargets(ctx: MoveContext): Promise<void> {
  for (const shard of ctx.shards)
    await runTransaction(ctx.target.client, dropShardSql(shard, [shardSchemaName(ctx.config, shard)]));
  await ctx.target.client.query(DELETE_CHUNKS_SQL, [ctx.moveId]);
  await stopTracking(ctx.target.client, ctx.moveId, schemasOf(ctx, ctx.shards));
  // The change logs the copy started on the source's large tables (copy-logs.ts), where the fence's
  // undo did not already remove them: off, then dropped where their tables are free.
  await stopDeltas(ctx.source.client, ctx.moveId, schemasOf(ctx, ctx.shards)).catch(() => undefined);
}
