import type { ShardctlConfig } from '../config/types.js';
import { provision, type ProvisionOptions, type ProvisionResult } from '../provisioning/run.js';

/**
 * `shardctl init`: on every host, the control schema and every shard the map gives it (schema,
 * next_id, then the migrations). Idempotent: on a complete cluster it reads a few catalog rows
 * per host and changes nothing.
 */
export function init(
  config: ShardctlConfig,
  options: Pick<ProvisionOptions, 'dryRun' | 'onProgress' | 'onNotice'> = {},
): Promise<ProvisionResult> {
  return provision(config, 'init', options);
}
