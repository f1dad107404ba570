import type { ShardctlConfig } from '../config/types.js';
import { adopt as adoptFleet, type AdoptOptions, type AdoptResult } from '../adopt/adopt.js';

/**
 * `shardctl adopt`: takes over a fleet built by hand from the Instagram article (schemas of the
 * prefix, the published next_id() in each): checks every mapped schema against the config's
 * layout and its stored ids, replaces next_id() in place under live inserts without repeating an
 * id, and records the shards (and, with a baseline, the migrations) as init would have.
 */
export function adopt(config: ShardctlConfig, options: AdoptOptions = {}): Promise<AdoptResult> {
  return adoptFleet(config, options);
}
