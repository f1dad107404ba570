import { shardTables } from './catalog.js';
import { schemasOf, type MoveContext } from './context.js';
import { hashMethods, type HashMethod } from './verify.js';

/**
 * The checksum method of each table of a move, chosen once per run (while nothing is fenced: the
 * choice tries the record hash on every table) and kept in the context.
 */
export async function ensureMethods(ctx: MoveContext): Promise<Map<string, HashMethod>> {
  if (!ctx.methods) {
    const tables = await shardTables(ctx.source.client, schemasOf(ctx, ctx.shards), 'leaves', { columnTypes: true });
    ctx.methods = await hashMethods(
      ctx.source.client,
      tables,
      Math.min(ctx.source.serverVersionNum, ctx.target.serverVersionNum) >= 140000,
    );
  }
  return ctx.methods;
}
