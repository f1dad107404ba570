import type { ShardctlConfig } from '../config/types.js';
import { refuseUnknownOptions } from '../config/validate.js';
import { provision, type ProvisionOptions, type ProvisionResult } from '../provisioning/run.js';

/**
 * `shardctl init`: on every host, the control schema and every shard the map gives it (schema,
 * next_id, then the migrations). Idempotent: on a complete cluster it reads a few catalog rows
 * per host and changes nothing.
 */
export async function init(
  config: ShardctlConfig,
  options: Pick<ProvisionOptions, 'dryRun' | 'onProgress' | 'onNotice'> = {},
): Promise<ProvisionResult> {
  refuseUnknownOptions('init options', options, ['dryRun', 'onProgress', 'onNotice']);
  return provision(config, 'init', options);
}
