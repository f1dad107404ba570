import { readSequencesSql, READ_SEQUENCE_DATA_SQL, setSequencesSql, type SequenceValue } from './sql/sequences.js';
import { SHARD_SEQUENCES_SQL } from './catalog.js';
import { type MoveContext, type SequenceState, type ShardSequence, schemasOf, waveShards } from './context.js';
import { quoteIdent } from '../pg/quote.js';
import { underFence, currentFenceReads } from './fence-limit.js';

/**
 * Sequences to the target: logical replication does not carry them.
 */

/**
 * Logical replication does not carry sequences. Each target sequence is set to at least the
 * source's state (read from the sequence itself, so a setval(..., false) is carried as such): every
 * new id on the target is then greater than every id of the shard (the sequence holds next_id's
 * position, and ids grow with it).
 */
export async function carrySequences(ctx: MoveContext): Promise<void> {
  if (ctx.mode === 'online')
    return underFence(ctx, 'the sequences of the wave on both hosts', () => carrySequencesNow(ctx));
  return carrySequencesNow(ctx);
}

async function carrySequencesNow(ctx: MoveContext): Promise<void> {
  const list = await listSequences(ctx);
  if (list.length === 0) return;
  // Online, the source's states as the fence string read them (every writer that got past the
  // fence had finished) and the target's as read before the fence (online, nothing writes to the
  // target's copies meanwhile; offline the copy does, and may fire triggers there): no round trip
  // while writes wait but the setval, if any.
  const fenced = ctx.mode === 'online' ? currentFenceReads(ctx) : null;
  const before = ctx.current.sequences?.target;
  const [src, dst] =
    fenced?.sequences && before && fenced.sequences.length === list.length && before.length === list.length
      ? [fenced.sequences, before]
      : await Promise.all([readSequences(ctx.source, list), readSequences(ctx.target, list)]);
  const behind: SequenceValue[] = [];
  list.forEach((sequence, i) => {
    const increment = sequence.incrementBy;
    const next = (r: SequenceState): bigint => BigInt(r.last_value) + (r.is_called ? increment : 0n);
    const s = src[i]!;
    const d = dst[i]!;
    // The value the target would hand out next must not come before the source's.
    const targetBehind = increment > 0n ? next(d) < next(s) : next(d) > next(s);
    if (targetBehind)
      behind.push({
        schema: sequence.schema,
        name: sequence.name,
        lastValue: BigInt(s.last_value),
        isCalled: s.is_called,
      });
  });
  if (behind.length > 0) await ctx.target.client.query(setSequencesSql(behind));
}

/**
 * The sequences of the wave's shards on the source, listed once per wave: before its fence (the
 * list is a catalog read that costs more than the values), or here when a resumed run finds the
 * wave fenced already. A sequence created by hand after the list has no copy on the target to carry
 * to; the verification finds its table's rows missing there.
 */
export async function listSequences(ctx: MoveContext): Promise<readonly ShardSequence[]> {
  if (ctx.current.sequences) return ctx.current.sequences.list;
  const rows = await ctx.source.client.query<{ schemaname: string; sequencename: string; increment_by: string }>(
    SHARD_SEQUENCES_SQL,
    [schemasOf(ctx, waveShards(ctx))],
  );
  const list = rows.rows.map((r) => ({
    schema: r.schemaname,
    name: r.sequencename,
    incrementBy: BigInt(r.increment_by),
  }));
  ctx.current.sequences = { list };
  return list;
}

/** The sequences' states on one host, in order: one statement, whatever their number, from PostgreSQL 18. */
export async function readSequences(
  side: MoveContext['source'],
  list: readonly ShardSequence[],
): Promise<SequenceState[]> {
  if (side.serverVersionNum >= 180000) {
    const names = list.map((s) => `${quoteIdent(s.schema)}.${quoteIdent(s.name)}`);
    const result = await side.client.query<SequenceState & { i: number }>(READ_SEQUENCE_DATA_SQL, [names]);
    // pg_get_sequence_data says nothing (NULL) of a sequence the role may not read: read it directly, which says why.
    if (result.rows.every((r) => r.last_value !== null)) return result.rows;
  }
  const pairs = list.map((s) => [s.schema, s.name] as const);
  return (await side.client.query<SequenceState>(readSequencesSql(pairs))).rows;
}
