import type { ShardctlConfig } from '../config/types.js';
import { refuseUnknownOptions } from '../config/validate.js';
import { UsageError } from '../errors.js';
import {
  COMMON_PROVISION_KEYS,
  provision,
  type CommonProvisionOptions,
  type ProvisionResult,
} from '../provisioning/run.js';

/**
 * `shardctl add-schema <shards>`: provision those shards on their mapped hosts at the fleet's
 * current migration level. Refuses (nothing written) when a shard's schema exists on another host.
 */
export async function addSchema(
  config: ShardctlConfig,
  shards: readonly number[],
  options: CommonProvisionOptions = {},
): Promise<ProvisionResult> {
  refuseUnknownOptions('add-schema options', options, COMMON_PROVISION_KEYS);
  const outside = shards.filter((s) => !Number.isInteger(s) || s < 0 || s >= config.shards);
  if (outside.length > 0) {
    throw new UsageError(`out of range; the config has shards 0-${config.shards - 1}`, {
      input: 'shards',
      value: outside.join(', '),
    });
  }
  return provision(config, 'add-schema', { ...options, shards });
}
