import type { ShardctlConfig } from '../config/types.js';
import { parseShardList } from '../config/ranges.js';
import { UsageError } from '../errors.js';
import { provision, type ProvisionOptions, type ProvisionResult } from '../provisioning/run.js';

/**
 * `shardctl add-schema <shards>`: provision those shards on their mapped hosts at the fleet's
 * current migration level. Refuses (nothing written) when a shard's schema exists on another host.
 */
export function addSchema(
  config: ShardctlConfig,
  shards: readonly number[],
  options: Pick<ProvisionOptions, 'dryRun' | 'onProgress' | 'onNotice'> = {},
): Promise<ProvisionResult> {
  const outside = shards.filter((s) => s >= config.shards);
  if (outside.length > 0) {
    throw new UsageError(`shards ${outside.join(', ')}: out of range; the config has shards 0-${config.shards - 1}`);
  }
  return provision(config, 'add-schema', { ...options, shards });
}

/** Parses the <shards> argument ("17", "100-199", "1,5-9"), naming the text when it is wrong. */
export function parseShardArgument(text: string, config: ShardctlConfig): number[] {
  const parsed = parseShardList(text);
  if ('error' in parsed) throw new UsageError(`argument <shards> ${JSON.stringify(text)}: ${parsed.error}`);
  const outside = parsed.shards.filter((s) => s >= config.shards);
  if (outside.length > 0) {
    throw new UsageError(`argument <shards> ${JSON.stringify(text)}: shard ${outside[0]} is out of range 0-${config.shards - 1}`);
  }
  return parsed.shards;
}
