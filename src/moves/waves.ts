/**
 * The cut-over waves of an online move: which shards are fenced and switched together.
 */

export interface WaveLimits {
  readonly maxShards?: number;
  readonly maxRows?: number;
}

// A wave's pause grows with its shards (one fence transaction each) and with the rows verified while
// fenced: since the checksums are taken before the fence (tail.ts), a table is checksummed whole then
// only when its changes cannot be counted (over 100,000 changed keys, no change logs). A 64-shard wave with verification under the fence blocked writes
// 1.6-2.2 s on a loaded machine; verified before the fence, a 16-shard wave blocked 85-131 ms and a
// 1,000,000-row shard 53-174 ms (docs/benchmarks.md).
const DEFAULT_WAVE = { maxShards: 64, maxRows: 2_000_000 };

/**
 * Splits a batch into cut-over waves: consecutive shards while a wave has at most maxShards shards
 * and maxRows estimated rows (a shard over the limit goes alone). Rows count because a table whose
 * changes cannot be counted (tail.ts) is checksummed whole while its wave is fenced.
 */
export function planWaves(
  shards: readonly number[],
  rows: ReadonlyMap<number, number>,
  limits: WaveLimits = {},
): number[][] {
  const maxShards = limits.maxShards ?? DEFAULT_WAVE.maxShards;
  const maxRows = limits.maxRows ?? DEFAULT_WAVE.maxRows;
  const waves: number[][] = [];
  let current: number[] = [];
  let currentRows = 0;
  for (const shard of shards) {
    const r = rows.get(shard) ?? 0;
    if (current.length > 0 && (current.length >= maxShards || currentRows + r > maxRows)) {
      waves.push(current);
      current = [];
      currentRows = 0;
    }
    current.push(shard);
    currentRows += r;
  }
  if (current.length > 0) waves.push(current);
  return waves;
}
