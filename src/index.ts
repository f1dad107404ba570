/**
 * shardctl's public API. The CLI (src/cli/) imports only from this file, so everything a command
 * can do, a program can do too; every type that appears in a result is exported here.
 */

// ids and config (the bottom layer)
export { loadConfig, parseConfig, resolveConfigPath } from './config/load.js';
export { parseShardList, parseShards, formatShardList, shardsPhrase } from './config/ranges.js';
export { inflect, plural } from './text.js';
export { hostForShard, shardSchemaName, type HostConfig, type ShardctlConfig } from './config/types.js';
export { configJsonSchema, type ConfigFile } from './config/schema.js';
export { durationMs } from './config/duration.js';
export { ShardMap, shardMovedTo, SHARD_MOVED_SQLSTATE, type ShardMapOptions } from './config/shard-map.js';
export {
  DEFAULT_ID_LAYOUT,
  DEFAULT_EPOCH_ISO,
  IdRangeError,
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
export { MAX_KEY, shardForKey } from './id/routing.js';
export { renderNextIdSql, ID_FUNCTION_VERSION } from './id/sql.js';
export { readMigrations, migrationNameProblem, type MigrationFile } from './migrations/files.js';
export { describeRollout, type FileRollout } from './migrations/rules.js';

// commands
export { init } from './commands/init.js';
export { addSchema } from './commands/add-schema.js';
export { adopt } from './commands/adopt.js';
export {
  AdoptRefusedError,
  type AdoptOptions,
  type AdoptResult,
  type AdoptHostResult,
  type AdoptedShard,
  type AdoptRefusal,
} from './adopt/adopt.js';
export {
  migrate,
  checkMigrations,
  type CheckMigrationsOptions,
  type MigrateOptions,
  type MigrationCheck,
  type HostPending,
  type PendingFile,
} from './commands/migrate.js';
export {
  newMigration,
  migrationHeader,
  type NewMigrationOptions,
  type NewMigrationResult,
} from './commands/migration-new.js';
export { status, type HostStatus, type MapStatus, type StatusResult } from './commands/status.js';
export {
  checkMoveShards,
  moveShard,
  moveShards,
  findRunningMoves,
  type BatchMoveResult,
} from './commands/move-shard.js';
export { gc, type GcOptions, type GcResult, type HostLeftover, type LeftTrigger, type OldCopy } from './commands/gc.js';
export {
  grant,
  grantSql,
  type GrantMode,
  type GrantOptions,
  type GrantResult,
  type GrantHostResult,
} from './commands/grant.js';
export type { Leftover } from './moves/leftovers.js';
export { shardLoad, type LoadResult, type HostLoad, type ShardLoadInfo } from './commands/load.js';
export { shardSizes, type SizesResult, type HostSizes, type ShardSizeInfo } from './commands/sizes.js';
export {
  rebalance,
  type RebalanceOptions,
  type RebalanceResult,
  type RebalanceRefusal,
  type RebalanceMoveResult,
  type UnfinishedMove,
} from './commands/rebalance.js';
export { decodeIds, type DecodedIdInfo } from './commands/decode.js';
export {
  mapPull,
  mapSetAddress,
  mapShow,
  type MapPullOptions,
  type MapPullResult,
  type MapSetAddressOptions,
  type MapSetAddressResult,
  type MapShowResult,
} from './commands/map.js';
export {
  currentMap,
  discoverFleet,
  type DiscoverFleetOptions,
  type FleetDiscovery,
  type FleetPlacement,
  type MapDisagreement,
} from './fleet/placement.js';
export {
  devUp,
  devDown,
  devStatus,
  devAddHost,
  type DevHost,
  type DevState,
  type DevHostStatus,
  type DevUpOptions,
  type DevAddHostOptions,
  type DevDownOptions,
  type DevStatusOptions,
} from './dev/dev.js';

// the types of command results
export type { ProvisionMode, ProvisionResult, ProvisionOptions } from './provisioning/run.js';
export type { HostOutcome, LockWait, ProgressEvent, ShardFailure } from './provisioning/execute.js';
export { DEFAULT_LOCK_RETRIES, describeLockHolder, type LockHolder } from './provisioning/lock-wait.js';
export type { Plan, HostPlan, ShardJob, JobStep } from './provisioning/plan.js';
export type { MoveOptions, MoveResult } from './moves/context.js';
export { cutOverUnderway, INTERRUPTED } from './moves/interrupt.js';
export type { WaveLimits } from './moves/waves.js';
export type { MoveProgressEvent, CopyProgressEvent, CatchUpProgressEvent } from './moves/copy-meter.js';
export {
  planRebalance,
  type RebalanceBy,
  type RebalanceHost,
  type PlannedMove,
  type RebalancePlan,
  type RebalanceHostPlan,
} from './moves/rebalance.js';
export type { PreflightCheck } from './moves/preflight.js';
export type { MoveMode, MoveStep, MoveRecord } from './moves/state.js';
export type { VerifyResult, TableVerification } from './moves/verify.js';

// errors and redaction
export {
  ShardctlError,
  ConfigError,
  UsageError,
  HostError,
  RuntimeFailure,
  StaleMapError,
  isShardctlError,
  type ConfigIssue,
  type ErrorJson,
  type FailureExitCode,
  type NextAction,
  type NextStep,
} from './errors.js';
export { redact, redactedJson, redactUrl, registerSecret } from './pg/redact.js';

// the application side
export {
  ShardRouter,
  type ShardRouterOptions,
  type ShardFn,
  type TransactionOptions,
  type ForEachShardOptions,
  type RouterSource,
  type SeedsSource,
} from './router/router.js';
export {
  encodeCursor,
  decodeCursor,
  MAX_PAGE_LIMIT,
  type Page,
  type PageOptions,
  type PageOrder,
} from './router/pages.js';
export { ShardFanOutError, groupFailures, type ShardResult, type FanOutFailure } from './router/errors.js';
export { COMMIT_UNKNOWN, CommitUnknownError } from './router/failover.js';
export {
  CALL_CHANNEL,
  SLOW_CALL_CHANNEL,
  type CallWait,
  type RouterCallEvent,
  type SlowCallEvent,
  type HostStats,
} from './router/diagnostics.js';
export {
  REPLICA_FALLBACKS,
  REPLICA_REFUSED,
  type ReplicaFallback,
  type ReplicaReadOptions,
  type WriteLsn,
} from './router/replicas.js';
export { describeStandby, type HostTopology, type StandbyStatus } from './fleet/topology.js';
export { parsePostgresUrl, TARGET_SESSION_ATTRS, type PostgresUrl, type TargetSessionAttrs } from './pg/multihost.js';
export { execSql, type ExecOptions, type ExecResult, type ExecValue } from './commands/exec.js';
export { psqlInvocation, findPsql, type PsqlInvocation } from './commands/psql.js';
