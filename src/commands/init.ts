import type { ShardctlConfig } from '../config/types.js';
import { refuseUnknownOptions } from '../config/validate.js';
import {
  COMMON_PROVISION_KEYS,
  provision,
  type CommonProvisionOptions,
  type ProvisionResult,
} from '../provisioning/run.js';

/**
 * `shardctl init`: on every host, the control schema and every shard the map gives it (schema,
 * next_id, then the migrations). Idempotent: on a complete cluster it reads a few catalog rows
 * per host and changes nothing.
 */
export async function init(config: ShardctlConfig, options: CommonProvisionOptions = {}): Promise<ProvisionResult> {
  refuseUnknownOptions('init options', options, COMMON_PROVISION_KEYS);
  return provision(config, 'init', options);
}
