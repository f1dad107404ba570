import { shardTables, type TypedShardTable } from './catalog.js';
import { schemasOf, type MoveContext } from './context.js';
import { hashMethods, type HashMethod } from './verify.js';

/**
 * The tables that hold the rows of the move's shards on the source (plain tables and partitions),
 * with their column types: read from the catalog once per run and kept in the context, for the
 * copy, the subscription's format, the checksum methods and the verification.
 */
export function moveLeafTables(ctx: MoveContext): Promise<readonly TypedShardTable[]> {
  // The read itself is kept, so that copies started together share it; a failed one is not kept.
  ctx.leafTables ??= shardTables(ctx.source.client, schemasOf(ctx, ctx.shards), 'leaves', { columnTypes: true }).catch(
    (error: unknown) => {
      ctx.leafTables = null;
      throw error;
    },
  );
  return ctx.leafTables;
}

/** The move's leaf tables (moveLeafTables) in these schemas. */
export async function leafTablesOf(ctx: MoveContext, schemas: readonly string[]): Promise<TypedShardTable[]> {
  const wanted = new Set(schemas);
  return (await moveLeafTables(ctx)).filter((t) => wanted.has(t.schema));
}

/**
 * The checksum method of each table of a move, chosen once per run (while nothing is fenced: the
 * choice probes the column types' hash functions) and kept in the context.
 */
export async function ensureMethods(ctx: MoveContext): Promise<Map<string, HashMethod>> {
  ctx.methods ??= await hashMethods(
    [ctx.source.client, ctx.target.client],
    await moveLeafTables(ctx),
    Math.min(ctx.source.serverVersionNum, ctx.target.serverVersionNum) >= 140000,
  );
  return ctx.methods;
}
