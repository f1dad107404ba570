/** Instagram routing: shard = key mod shards; then host = map[shard]. */

/** The largest key: a PostgreSQL bigint's largest value, what a key column can hold. */
export const MAX_KEY = 2n ** 63n - 1n;

export function shardForKey(key: bigint | number, shards: number): number {
  const k = typeof key === 'bigint' ? key : BigInt(key);
  if (typeof key === 'number' && !Number.isSafeInteger(key)) {
    throw new RangeError(`key ${key} is not a safe integer; pass a bigint`);
  }
  if (k < 0n) throw new RangeError(`key ${k} is negative`);
  if (k > MAX_KEY) throw new RangeError(`key ${k} is beyond a PostgreSQL bigint (at most 2^63 - 1)`);
  if (!Number.isInteger(shards) || shards < 1) throw new RangeError(`shards ${shards} must be a positive integer`);
  return Number(k % BigInt(shards));
}
