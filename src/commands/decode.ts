import type { ShardctlConfig } from '../config/types.js';
import { hostForShard } from '../config/types.js';
import { UsageError } from '../errors.js';
import { decodeId, DEFAULT_ID_LAYOUT, parseIdString, type IdLayout } from '../id/layout.js';

export interface DecodedIdInfo {
  /** Decimal string: ids do not fit a JavaScript number. */
  readonly id: string;
  readonly timestamp: string;
  /** Decimal string of Unix milliseconds. */
  readonly unixMs: string;
  readonly shard: number;
  readonly sequence: number;
  /** The host the map puts the shard on; null without a config or for a shard outside it. */
  readonly host: string | null;
}

/** Decodes ids given as decimal strings. All arguments are checked before any output. */
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
  return parsed.map(({ id }) => {
    const decoded = decodeId(id!, layout);
    const host = config && decoded.shard < config.shards ? (hostForShard(config, decoded.shard)?.name ?? null) : null;
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
