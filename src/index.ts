/**
 * shardctl's public API. The CLI (src/cli/) is built only on what is exported here.
 */
export { loadConfig, parseConfig, resolveConfigPath } from './config/load.js';
export { parseShardList, formatShardList } from './config/ranges.js';
export { hostForShard, shardSchemaName, type HostConfig, type ShardctlConfig } from './config/types.js';
export {
  DEFAULT_ID_LAYOUT,
  decodeId,
  describeLayout,
  encodeId,
  layoutEndUnixMs,
  maxShards,
  parseIdString,
  timeBits,
  type DecodedId,
  type IdLayout,
  type IdParts,
} from './id/layout.js';
export { shardForKey } from './id/routing.js';
export { decodeIds, type DecodedIdInfo } from './id/decode.js';
export { renderNextIdSql, ID_FUNCTION_VERSION } from './id/sql.js';
export { init } from './provisioning/init.js';
export { addSchema } from './provisioning/add-schema.js';
export { status, type HostStatus, type StatusResult } from './provisioning/status.js';
export { migrate, checkMigrations, type MigrationCheck } from './migrations/migrate.js';
export { readMigrations, type MigrationFile } from './migrations/files.js';
export type { ProvisionResult, ProvisionOptions } from './provisioning/run.js';
export type { HostOutcome, ProgressEvent, ShardFailure } from './provisioning/execute.js';
export { moveShard, type MoveOptions, type MoveResult } from './moves/move.js';
export { gc, type OldCopy } from './moves/gc.js';
export { ShardMap, shardMovedTo, SHARD_MOVED_SQLSTATE } from './config/shard-map.js';
export { devUp, devDown, devStatus } from './dev/dev.js';
export {
  ShardctlError,
  ConfigError,
  UsageError,
  HostError,
  RuntimeFailure,
  type ConfigIssue,
  type ErrorJson,
} from './errors.js';
export { redact } from './pg/redact.js';
export {
  ShardRouter,
  type ShardRouterOptions,
  type ShardFn,
  type TransactionOptions,
  type ForEachShardOptions,
} from './router/router.js';
export { ShardFanOutError, type ShardResult, type FanOutFailure } from './router/errors.js';
