import type pg from 'pg';
import { shardSchemaName } from '../config/types.js';
import { ASYNC_COMMIT_SQL, DURABLE_FLUSH_SQL } from '../fleet/control.js';
import { dropShardSql } from '../fleet/sql.js';
import { awaitedLater } from '../promises.js';
import { endQuietly, rollbackQuietly, runTransaction } from '../pg/quiet.js';
import { refreshMaterializedViewSql, renameWithStubSql, type Grant } from './sql/cleanup.js';
import { SHARD_SCHEMA_NAMES_SQL } from './sql/control.js';
import { dropUnusedFenceGuardsSql } from './sql/leftovers.js';
import { dropIncomingGuards } from './sql/incoming.js';
import { oldCopyName } from './sql/names.js';
import { TABLE_NAMES_SQL } from './sql/fence.js';
import { RESET_SYNCHRONOUS_COMMIT_SQL } from './sql/session.js';
import { CLEANUP_CHUNK, CLEANUP_WORKER, moveWorker } from './workers.js';
import { groupBySchema, MATERIALIZED_VIEWS_SQL, SCHEMA_GRANTS_SQL, TABLE_GRANTS_SQL } from './catalog.js';
import { type MoveContext, schemasOf } from './context.js';
import { endLogs } from './tail.js';
import { dropPublicationAndSlot, deleteMarkers } from './replication.js';
import { dropSubscription } from './leftovers.js';
import { DELETE_CHUNKS_SQL } from './chunks.js';

/** The last step of a move (`cleaned`), after the switch: nothing to undo. */

/**
 * Replication objects removed; each old copy kept fenced under a new name until gc, or dropped;
 * materialized views refreshed on the target. What is left to do is decided by the source's control
 * rows, not by what schemas exist: after the rename a schema of views keeps the old name, so
 * existence cannot tell a finished clean-up from an interrupted one.
 */
export async function cleanUp(ctx: MoveContext): Promise<void> {
  const { source } = ctx;
  // The target drops the subscription (which stops its apply worker and drops the slot over a
  // connection of its own) while the source renames or drops the old copies: they are fenced, so
  // nothing streams from them any more, and neither waits for the other. The publication and the
  // slot, on the source's session, go after the renames.
  const unsubscribed = awaitedLater(dropSubscription(ctx.target.client, ctx.name));
  // Read meanwhile, queued behind the drop; awaited after the renames.
  const views = awaitedLater(
    ctx.target.client.query<{ schemaname: string; matviewname: string }>(MATERIALIZED_VIEWS_SQL, [
      schemasOf(ctx, ctx.shards),
    ]),
  );
  try {
    const work = await cleanUpWork(ctx);
    // One transaction per shard (its rename or drop with its control row), CLEANUP_CHUNK of them per
    // round trip, none waiting for the WAL flush; the flush after the last covers all of them. A crash
    // before it can undo some, which the control rows show and a resumed clean-up redoes. A second
    // session takes its share of the round trips once it has connected (none if it cannot).
    const chunks: string[] = [];
    for (let i = 0; i < work.length; i += CLEANUP_CHUNK) chunks.push(work.slice(i, i + CLEANUP_CHUNK).join('\n'));
    const helping = chunks.length > 1 ? openHelper(ctx) : null;
    const settled = await Promise.allSettled([
      renameOn(source.client, chunks),
      helping?.then(async (helper) => {
        if (!helper) return;
        try {
          await renameOn(helper, chunks);
        } finally {
          await endQuietly(helper);
        }
      }),
    ]);
    for (const s of settled) if (s.status === 'rejected') throw s.reason;
    await runTransaction(source.client, DURABLE_FLUSH_SQL);
  } finally {
    // A failed rename leaves the target's session to the caller's undo only once the drop has ended.
    await unsubscribed.catch(() => undefined);
  }
  await unsubscribed;
  await dropPublicationAndSlot(ctx);
  // With the old copies dropped, the guard their fence triggers called.
  if (ctx.options.dropSource) await source.client.query(dropUnusedFenceGuardsSql({ moveId: ctx.moveId }));
  for (const v of (await views).rows) {
    await ctx.target.client.query(refreshMaterializedViewSql(v.schemaname, v.matviewname));
    ctx.refreshed.push(`${v.schemaname}.${v.matviewname}`);
  }
  // The change logs the old copies keep (they refuse every write) off, and every entry gone.
  await Promise.all([
    deleteMarkers(ctx),
    ctx.target.client.query(DELETE_CHUNKS_SQL, [ctx.moveId]),
    endLogs(ctx.source.client, ctx.moveId),
    endLogs(ctx.target.client, ctx.moveId),
  ]);
  // The incoming copies' guards, active now (they let every write through), where their tables are free.
  await dropIncomingGuards(ctx.target.client, ctx.moveId, schemasOf(ctx, ctx.shards));
}

/**
 * The clean-up's SQL: each old copy's rename (or drop), for the shards whose source schema still
 * has the shard's name in the source's control rows.
 */
async function cleanUpWork(ctx: MoveContext): Promise<string[]> {
  const rows = await ctx.source.client.query<{ shard: number; schema_name: string }>(SHARD_SCHEMA_NAMES_SQL, [
    ctx.shards,
  ]);
  const current = new Map(rows.rows.map((r) => [r.shard, r.schema_name]));
  if (ctx.options.dropSource) {
    return ctx.shards.flatMap((shard) => {
      const now = current.get(shard);
      return now === undefined ? [] : [dropShardSql(shard, [now, shardSchemaName(ctx.config, shard)])];
    });
  }
  const renaming = ctx.shards.filter((shard) => current.get(shard) === shardSchemaName(ctx.config, shard));
  return renamesWithStubs(ctx, renaming);
}

/**
 * The clean-up's round trips taken one by one from `chunks` (shared with the other session) on
 * `client`, committing without waiting for the WAL flush; on a failure its aborted transaction is
 * rolled back (the shards before it are done) and the failure thrown.
 */
async function renameOn(client: pg.Client, chunks: string[]): Promise<void> {
  await client.query(ASYNC_COMMIT_SQL);
  try {
    for (let sql = chunks.shift(); sql !== undefined; sql = chunks.shift()) await client.query(sql);
  } catch (error) {
    // The other session stops after its current round trip.
    chunks.length = 0;
    // A failed statement leaves its shard's transaction open, aborted: the shards before it are done.
    await rollbackQuietly(client);
    throw error;
  } finally {
    // Only the session's commit mode: on a broken connection the flush after fails and says so.
    await client.query(RESET_SYNCHRONOUS_COMMIT_SQL).catch(() => undefined);
  }
}

/**
 * A second session on the source for the clean-up's renames: the spare the last wave's fence opened
 * (fence.ts), else a new one; null when none can be had (the move's session then does them
 * all).
 */
async function openHelper(ctx: MoveContext): Promise<pg.Client | null> {
  return moveWorker(ctx, ctx.source.host, CLEANUP_WORKER).catch(() => null);
}

/**
 * The SQL of each shard's rename (see renameWithStubSql), with the tables and grants read from the
 * source's catalog in one query each for all of them.
 */
async function renamesWithStubs(ctx: MoveContext, shards: readonly number[]): Promise<string[]> {
  if (shards.length === 0) return [];
  const { source } = ctx;
  const schemas = schemasOf(ctx, shards);
  const [tables, schemaGrants, tableGrants] = await Promise.all([
    source.client.query<{ schema: string; table: string }>(TABLE_NAMES_SQL, [schemas]).then((r) => r.rows),
    source.client.query<Grant & { nspname: string }>(SCHEMA_GRANTS_SQL, [schemas]),
    source.client.query<Grant & { nspname: string }>(TABLE_GRANTS_SQL, [schemas]),
  ]);
  const tablesOf = groupBySchema(tables, (t) => t.schema);
  const schemaGrantsOf = groupBySchema(schemaGrants.rows, (g) => g.nspname);
  const tableGrantsOf = groupBySchema(tableGrants.rows, (g) => g.nspname);
  return shards.map((shard) => {
    const schema = shardSchemaName(ctx.config, shard);
    return renameWithStubSql({
      shard,
      schema,
      renamed: oldCopyName(schema, ctx.moveId),
      targetHost: ctx.target.host.name,
      tables: (tablesOf.get(schema) ?? []).map((t) => t.table),
      schemaGrants: schemaGrantsOf.get(schema) ?? [],
      tableGrants: tableGrantsOf.get(schema) ?? [],
    });
  });
}
