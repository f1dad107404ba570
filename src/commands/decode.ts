import type { ShardctlConfig } from '../config/types.js';
import { hostForShard } from '../config/types.js';
import { UsageError } from '../errors.js';
import { type DecodedId, decodeId, DEFAULT_ID_LAYOUT, parseIdString, type IdLayout } from '../id/layout.js';

export interface DecodedIdInfo {
  /** Decimal string: ids do not fit a JavaScript number. */
  readonly id: string;
  readonly timestamp: string;
  /** Decimal string of Unix milliseconds. */
  readonly unixMs: string;
  readonly shard: number;
  readonly sequence: number;
  /** The host the map puts the shard on; null without a config. */
  readonly host: string | null;
}

/**
 * Decodes ids given as decimal strings. All arguments are checked before any output. With a config,
 * an id whose shard the config has not is refused: no id of this fleet carries it (the shard count
 * never changes after init), so it is another fleet's, or not an id at all.
 */
export function decodeIds(ids: readonly string[], config: ShardctlConfig | null): DecodedIdInfo[] {
  const layout: IdLayout = config?.idLayout ?? DEFAULT_ID_LAYOUT;
  const parsed = ids.map((text) => ({ text, id: parseIdString(text.trim()) }));
  const bad = parsed.filter((p) => p.id === undefined);
  if (bad.length > 0) {
    throw new UsageError(
      `${bad.map((b) => JSON.stringify(b.text)).join(', ')}: not a positive decimal 64-bit integer`,
      { input: 'ids', data: { ids: bad.map((b) => b.text) } },
    );
  }
  const decodedIds = parsed.map(({ text, id }) => ({ text, decoded: decodeId(id!, layout) }));
  if (config) refuseShardsOutside(decodedIds, config.shards);
  return decodedIds.map(({ decoded }) => {
    const host = config ? (hostForShard(config, decoded.shard)?.name ?? null) : null;
    return {
      id: decoded.id.toString(),
      timestamp: decoded.timestamp,
      unixMs: decoded.unixMs.toString(),
      shard: decoded.shard,
      sequence: decoded.sequence,
      host,
    };
  });
}

function refuseShardsOutside(ids: readonly { text: string; decoded: DecodedId }[], shards: number): void {
  const outside = ids.filter((i) => i.decoded.shard >= shards);
  if (outside.length === 0) return;
  const which = outside.map((o) => `${JSON.stringify(o.text)} carries shard ${o.decoded.shard}`).join(', ');
  throw new UsageError(`${which}, not in the map (0-${shards - 1}): not an id of this fleet`, {
    input: 'ids',
    data: { ids: outside.map((o) => o.text) },
  });
}
