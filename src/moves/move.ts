import { randomBytes } from 'node:crypto';
import pg from 'pg';
import copyStreams from 'pg-copy-streams';
import { pipeline } from 'node:stream/promises';
import type { HostConfig, ShardctlConfig } from '../config/types.js';
import { hostForShard, shardSchemaName } from '../config/types.js';
import { rewriteShardOwner } from '../config/rewrite.js';
import { HostError, RuntimeFailure, ShardctlError, UsageError } from '../errors.js';
import { readMigrations, type MigrationFile } from '../migrations/files.js';
import { checkClientConnection, connectHost, CONTROL_SCHEMA, describePgError } from '../pg/connect.js';
import { acquireRunnerLock, releaseRunnerLock } from '../pg/locks.js';
import { quoteIdent, quoteLiteral } from '../pg/quote.js';
import { controlTableExists } from '../provisioning/catalog.js';
import { controlSchemaSql, createShardSql, dropShardSql, migrationSql, noTransactionMigrationSteps } from '../provisioning/shard-sql.js';
import { preflight, type PreflightCheck } from './preflight.js';
import { insertMove, recordStep, replicationName, runningMove, stepsFor, type MoveMode, type MoveRecord, type MoveStep } from './state.js';
import { shardTables, verifyShard, type VerifyResult } from './verify.js';

/**
 * `shardctl move-shard`: move one logical shard to another host, online (logical replication) or
 * offline (COPY with writes fenced), with every step recorded on both hosts so that a move cut
 * off at any point is finished by --resume or undone by --abort.
 */

export interface MoveOptions {
  readonly mode?: MoveMode;
  readonly dryRun?: boolean;
  readonly resume?: boolean;
  readonly abort?: boolean;
  /** Drop the old copy right after the switch instead of keeping it (fenced, renamed) until gc. */
  readonly dropSource?: boolean;
  /** The config file to rewrite at the switch (default: config.file). */
  readonly configFile?: string;
  /** How long the target may take to apply the last changes after the fence (default 30 s). */
  readonly catchUpTimeoutMs?: number;
  readonly onStep?: (step: MoveStep, detail: string) => void;
}

export interface MoveResult {
  readonly moveId: string;
  readonly shard: number;
  readonly source: string;
  readonly target: string;
  readonly mode: MoveMode;
  readonly outcome: 'moved' | 'aborted' | 'dry-run';
  readonly preflight: readonly PreflightCheck[];
  readonly plan: readonly MoveStep[];
  /** Rows verified on the target. Decimal string (a count can pass 2^53 in principle). */
  readonly rowsMoved: string;
  /** From the moment the fence was requested until the map pointed at the target. */
  readonly writeBlockedMs: number | null;
  readonly durationMs: number;
  readonly verification: VerifyResult | null;
}

interface Side {
  readonly host: HostConfig;
  readonly client: pg.Client;
  /** server_version_num, read once when connecting. */
  readonly version: number;
}

interface MoveContext {
  readonly config: ShardctlConfig;
  readonly shard: number;
  readonly schema: string;
  readonly moveId: string;
  readonly mode: MoveMode;
  readonly source: Side;
  readonly target: Side;
  readonly migrations: readonly MigrationFile[];
  readonly options: MoveOptions;
  readonly name: string;
  fenceStartedAt: number | null;
  writeBlockedMs: number | null;
  verification: VerifyResult | null;
  /**
   * The marker kind of the current fence attempt. Each attempt has its own: after a catch-up timeout
   * the source is unfenced, and the old marker may still be on its way to the target.
   */
  fenceMarker: string | null;
}

export async function moveShard(config: ShardctlConfig, shard: number, targetName: string | undefined, options: MoveOptions = {}): Promise<MoveResult> {
  const started = performance.now();
  if (!Number.isInteger(shard) || shard < 0 || shard >= config.shards) {
    throw new UsageError(`argument <shard> ${shard}: out of range 0-${config.shards - 1}`);
  }
  if (options.resume && options.abort) throw new UsageError('options --resume and --abort exclude each other');
  const migrations = await readMigrations(config.migrationsDir);

  if (options.resume || options.abort) {
    return continueMove(config, shard, migrations, options, started);
  }
  if (!targetName) throw new UsageError('option --to <host> is required to start a move');
  const target = config.hosts.find((h) => h.name === targetName);
  if (!target) {
    throw new UsageError(`option --to ${JSON.stringify(targetName)}: no such host in the map (hosts: ${config.hosts.map((h) => h.name).join(', ')})`);
  }
  const source = hostForShard(config, shard)!;
  const mode = options.mode ?? 'online';
  const sides = await connectBoth(source, target);
  try {
    if (!options.dryRun) await lockBoth({ ...sides, lockTimeout: config.lockTimeout });
    const checks = await preflight({
      config,
      shard,
      mode,
      source,
      target,
      sourceClient: sides.source.client,
      targetClient: sides.target.client,
      migrations,
      probeReachability: !options.dryRun && mode === 'online' && source.name !== target.name,
      configFile: options.configFile ?? config.file,
    });
    const plan = stepsFor(mode);
    const failed = checks.filter((c) => !c.ok);
    if (options.dryRun) {
      return {
        moveId: '(dry run)',
        shard,
        source: source.name,
        target: target.name,
        mode,
        outcome: 'dry-run',
        preflight: checks,
        plan,
        rowsMoved: '0',
        writeBlockedMs: null,
        durationMs: elapsed(started),
        verification: null,
      };
    }
    if (failed.length > 0) {
      throw new RuntimeFailure(
        'PREFLIGHT_FAILED',
        `move of shard ${shard} from ${source.name} to ${target.name} not started; nothing was changed:\n${failed.map((c) => `  - ${c.name}: ${c.message}`).join('\n')}`,
        { checks },
        failed.map((c) => `${c.name}: ${c.message}`),
      );
    }
    const moveId = newMoveId();
    const ctx = context(config, shard, moveId, mode, sides, migrations, options);
    for (const side of [ctx.source, ctx.target]) await side.client.query(controlSchemaSql(config));
    for (const side of [ctx.source, ctx.target]) {
      await insertMove(side.client, { moveId, shard, source: source.name, target: target.name, mode, step: 'prepared' });
    }
    announce(ctx, 'prepared', `move ${moveId}: shard ${shard} from ${source.name} to ${target.name} (${mode})`);
    faultAfter('prepared');
    await runSteps(ctx, 'prepared');
    return result(ctx, 'moved', checks, started);
  } finally {
    await closeBoth(sides);
  }
}

/** --resume and --abort: find the unfinished move on the hosts and carry it on or undo it. */
async function continueMove(
  config: ShardctlConfig,
  shard: number,
  migrations: readonly MigrationFile[],
  options: MoveOptions,
  started: number,
): Promise<MoveResult> {
  const record = await findRunningMove(config, shard);
  if (!record) {
    throw new RuntimeFailure('NO_MOVE', `no unfinished move of shard ${shard} is recorded on any host; nothing to ${options.resume ? 'resume' : 'abort'}`);
  }
  const source = config.hosts.find((h) => h.name === record.source);
  const target = config.hosts.find((h) => h.name === record.target);
  if (!source || !target) {
    throw new RuntimeFailure('MOVE_HOSTS', `move ${record.moveId} is between ${record.source} and ${record.target}, but the map lacks one of them`);
  }
  const sides = await connectBoth(source, target);
  try {
    if (!options.dryRun) await lockBoth({ ...sides, lockTimeout: config.lockTimeout });
    // The hosts may disagree by one step (a crash between the two updates): redo from the earlier.
    const onSource = await runningMove(sides.source.client, shard);
    const onTarget = await runningMove(sides.target.client, shard);
    const steps = stepsFor(record.mode);
    const recorded = [onSource, onTarget].filter((r): r is MoveRecord => r !== null && r.moveId === record.moveId);
    const step = recorded.map((r) => r.step).sort((a, b) => steps.indexOf(a) - steps.indexOf(b))[0] ?? record.step;
    const detail = (onSource ?? onTarget ?? record).detail;
    const ctx = context(config, shard, record.moveId, record.mode, sides, migrations, options, detail);
    if (options.dryRun) {
      return { ...result(ctx, 'dry-run', [], started), plan: steps.slice(steps.indexOf(step) + 1) };
    }
    if (options.abort) {
      await abortMove(ctx, step);
      return result(ctx, 'aborted', [], started);
    }
    announce(ctx, step, `resuming move ${record.moveId} after step ${step}`);
    await runSteps(ctx, step);
    return result(ctx, 'moved', [], started);
  } finally {
    await closeBoth(sides);
  }
}

async function findRunningMove(config: ShardctlConfig, shard: number): Promise<MoveRecord | null> {
  const errors: string[] = [];
  for (const host of config.hosts) {
    let client: pg.Client | null = null;
    try {
      client = await connectHost(host, { applicationName: 'shardctl move' });
      if (!(await controlTableExists(client, 'moves'))) continue;
      const record = await runningMove(client, shard);
      if (record) return record;
    } catch (error) {
      errors.push(error instanceof Error ? error.message : String(error));
    } finally {
      await client?.end().catch(() => undefined);
    }
  }
  if (errors.length > 0) throw new RuntimeFailure('HOST_UNREACHABLE', `cannot look for the move of shard ${shard}: ${errors.join('; ')}`);
  return null;
}

async function runSteps(ctx: MoveContext, after: MoveStep): Promise<void> {
  const steps = stepsFor(ctx.mode);
  for (const step of steps.slice(steps.indexOf(after) + 1)) {
    try {
      await STEP_ACTIONS[step](ctx);
    } catch (error) {
      if (error instanceof ShardctlError) throw error;
      const side = (error as { side?: Side }).side;
      throw new HostError(side?.host.name ?? ctx.source.host.name, `move ${ctx.moveId} failed at step ${step}: ${describePgError(error)}; run move-shard ${ctx.shard} --resume to retry, or --abort to undo`, {
        shard: ctx.shard,
        code: 'MOVE_FAILED',
        cause: error,
        data: { moveId: ctx.moveId, step },
      });
    }
    await record(ctx, step, step === 'cleaned' ? 'done' : 'running');
  }
}

async function record(ctx: MoveContext, step: MoveStep, status: MoveRecord['status'], detail: Record<string, unknown> = {}): Promise<void> {
  await recordStep(ctx.source.client, ctx.moveId, step, status, detail);
  await recordStep(ctx.target.client, ctx.moveId, step, status, detail);
  announce(ctx, step, status === 'aborted' ? 'aborted' : `done: ${step}`);
  // An abort re-records the step it undid: that is no step completing.
  if (status !== 'aborted') faultAfter(step);
}

/** Fault injection for the crash tests: die right after a step is recorded, as SIGKILL would. */
function faultAfter(step: MoveStep): void {
  if (process.env['SHARDCTL_FAULT_AFTER_STEP'] === step) process.kill(process.pid, 'SIGKILL');
}

type StepAction = (ctx: MoveContext) => Promise<void>;

const STEP_ACTIONS: Record<MoveStep, StepAction> = {
  prepared: async () => undefined,
  'target-created': createTarget,
  published: publish,
  subscribed: subscribe,
  synced: waitForSync,
  fenced: fence,
  'caught-up': waitForCatchUp,
  copied: (ctx) => (ctx.mode === 'online' ? copyFromSnapshot(ctx) : copyTables(ctx)),
  'sequences-carried': carrySequences,
  verified: verify,
  switched: switchMap,
  cleaned: cleanUp,
};

/** The shard's schema on the target, at the source's migration level, marked incoming. */
async function createTarget(ctx: MoveContext): Promise<void> {
  const { source, target, shard, config } = ctx;
  const applied = await source.client.query<{ version: number }>(
    `SELECT version FROM ${CONTROL_SCHEMA}.migrations WHERE shard = $1 ORDER BY version`,
    [shard],
  );
  const files = new Map(ctx.migrations.map((m) => [m.version, m]));
  const exists = await target.client.query<{ e: boolean }>(`SELECT to_regnamespace($1) IS NOT NULL AS e`, [ctx.schema]);
  if (!exists.rows[0]!.e) await onSide(target, () => target.client.query(createShardSql(config, shard, true, 'incoming')));
  const done = await target.client.query<{ version: number }>(`SELECT version FROM ${CONTROL_SCHEMA}.migrations WHERE shard = $1`, [shard]);
  const have = new Set(done.rows.map((r) => r.version));
  for (const { version } of applied.rows) {
    if (have.has(version)) continue;
    const file = files.get(version);
    if (!file) throw new RuntimeFailure('MIGRATION_DRIFT', `migration version ${version} of shard ${shard} has no file; restore it and --resume`);
    if (file.noTransaction) {
      for (const sql of noTransactionMigrationSteps(config, shard, file)) await onSide(target, () => target.client.query(sql));
    } else {
      await onSide(target, () => target.client.query(migrationSql(config, shard, file)));
    }
  }
}

async function publish(ctx: MoveContext): Promise<void> {
  const exists = await ctx.source.client.query(`SELECT 1 FROM pg_publication WHERE pubname = $1`, [ctx.name]);
  if (exists.rowCount) return;
  // The marker table rides along (only this move's rows): see waitForCatchUp.
  await onSide(ctx.source, () =>
    ctx.source.client.query(
      `CREATE PUBLICATION ${quoteIdent(ctx.name)} FOR TABLES IN SCHEMA ${quoteIdent(ctx.schema)},
         TABLE ${quoteIdent(CONTROL_SCHEMA)}.move_markers WHERE (move_id = ${quoteLiteral(ctx.moveId)})`,
    ),
  );
}

async function subscribe(ctx: MoveContext): Promise<void> {
  const exists = await ctx.target.client.query(`SELECT 1 FROM pg_subscription WHERE subname = $1`, [ctx.name]);
  if (exists.rowCount) return;
  // The rows are already there (copied from the slot's snapshot): the subscription only streams
  // what changed since, from the slot the copy step created. Binary between equal major versions.
  const binary = sameMajorVersion(ctx);
  await onSide(ctx.target, () =>
    ctx.target.client.query(
      `CREATE SUBSCRIPTION ${quoteIdent(ctx.name)} CONNECTION ${quoteLiteral(ctx.source.host.replicationUrl)}
         PUBLICATION ${quoteIdent(ctx.name)}
         WITH (slot_name = ${quoteLiteral(ctx.name)}, create_slot = false, copy_data = false, binary = ${binary})`,
    ),
  );
}

/**
 * Online copy: a logical slot created with an exported snapshot, and every table copied as of that
 * snapshot (binary COPY between equal majors, one target transaction after a TRUNCATE), so the
 * subscription created next streams exactly the changes after the copy. Measured faster than the
 * subscription's own initial copy (PostgreSQL 15: 1.2-1.4 s vs 1.8 s for a million rows).
 * A slot left by an interrupted copy lost its snapshot with its connection: dropped, copied again.
 */
async function copyFromSnapshot(ctx: MoveContext): Promise<void> {
  await dropSlot(ctx);
  // node-postgres supports replication connections; its type definitions do not list the option.
  const config: pg.ClientConfig & { replication: string } = {
    connectionString: ctx.source.host.url,
    replication: 'database',
    application_name: 'shardctl move',
  };
  const replication = new pg.Client(config);
  replication.on('error', () => undefined);
  await onSide(ctx.source, async () => {
    await replication.connect();
    await checkClientConnection(replication);
  });
  try {
    const slot = await onSide(ctx.source, () =>
      replication.query<{ snapshot_name: string }>(`CREATE_REPLICATION_SLOT ${quoteIdent(ctx.name)} LOGICAL pgoutput EXPORT_SNAPSHOT`),
    );
    await copyTables(ctx, slot.rows[0]!.snapshot_name);
  } finally {
    await replication.end().catch(() => undefined);
  }
}

/** Every table copied and streaming; then one marker round trip, so the cut-over starts nearly caught up. */
async function waitForSync(ctx: MoveContext): Promise<void> {
  const errors = async (): Promise<number> => {
    const r = await ctx.target.client.query<{ n: string }>(
      `SELECT coalesce(sum(sync_error_count + apply_error_count), 0)::text AS n FROM pg_stat_subscription_stats WHERE subname = $1`,
      [ctx.name],
    );
    return Number(r.rows[0]?.n ?? 0);
  };
  const baseline = await errors();
  for (;;) {
    // The subscription retries a failed copy for ever; three failures in a row stop the move instead.
    const failures = (await errors()) - baseline;
    if (failures >= 3) {
      throw new RuntimeFailure(
        'SYNC_FAILED',
        `host ${ctx.target.host.name}, shard ${ctx.shard}: the initial copy failed ${failures} times (the reason is in that host's server log); ` +
          `fix it and run move-shard ${ctx.shard} --resume, or --abort to undo the move`,
      );
    }
    const r = await ctx.target.client.query<{ total: string; pending: string }>(
      `SELECT count(*) AS total, count(*) FILTER (WHERE r.srsubstate <> 'r') AS pending
         FROM pg_subscription_rel r JOIN pg_subscription s ON s.oid = r.srsubid WHERE s.subname = $1`,
      [ctx.name],
    );
    const { total, pending } = r.rows[0]!;
    if (Number(total) > 0 && Number(pending) === 0) break;
    await sleep(50);
  }
  await ctx.source.client.query(
    `INSERT INTO ${CONTROL_SCHEMA}.move_markers (move_id, kind) VALUES ($1, 'synced') ON CONFLICT DO NOTHING`,
    [ctx.moveId],
  );
  await waitForMarker(ctx, 'synced', 600_000);
}

/**
 * The fence, in one transaction on the source: wait for in-flight writers (SHARE ROW EXCLUSIVE
 * conflicts with their locks), then a statement trigger on every table that refuses every write with
 * SQLSTATE SC100, the shard marked fenced, and the fence marker the target waits for.
 */
async function fence(ctx: MoveContext): Promise<void> {
  const { source, schema } = ctx;
  const tables = await shardTables(source.client, schema, 'all');
  const marker = `fenced-${Date.now().toString(36)}`;
  ctx.fenceMarker = marker;
  ctx.fenceStartedAt = performance.now();
  const qualified = tables.map((t) => `${quoteIdent(schema)}.${quoteIdent(t)}`);
  // CREATE OR REPLACE TRIGGER needs PostgreSQL 14; before that, drop and create (a stronger lock,
  // held for the few milliseconds of this transaction).
  const replace = source.version >= 140000;
  const triggers = qualified
    .map(
      (t) =>
        `${replace ? 'CREATE OR REPLACE TRIGGER' : `DROP TRIGGER IF EXISTS shardctl_fence ON ${t};\nCREATE TRIGGER`} shardctl_fence BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON ${t}
           FOR EACH STATEMENT EXECUTE FUNCTION ${quoteIdent(CONTROL_SCHEMA)}.shard_fenced(${quoteLiteral(String(ctx.shard))}, ${quoteLiteral(ctx.target.host.name)});`,
    )
    .join('\n');
  const sql = [
    'BEGIN;',
    `SET LOCAL lock_timeout = '2s';`,
    qualified.length > 0 ? `LOCK TABLE ${qualified.join(', ')} IN SHARE ROW EXCLUSIVE MODE;` : '',
    triggers,
    `UPDATE ${CONTROL_SCHEMA}.shards SET state = 'fenced' WHERE shard = ${ctx.shard};`,
    `INSERT INTO ${CONTROL_SCHEMA}.move_markers (move_id, kind) VALUES (${quoteLiteral(ctx.moveId)}, ${quoteLiteral(marker)}) ON CONFLICT DO NOTHING;`,
    `UPDATE ${CONTROL_SCHEMA}.moves SET detail = detail || ${quoteLiteral(JSON.stringify({ fenceMarker: marker }))}::jsonb WHERE move_id = ${quoteLiteral(ctx.moveId)};`,
    'COMMIT;',
  ].join('\n');
  for (let attempt = 1; ; attempt++) {
    try {
      await source.client.query(sql);
      return;
    } catch (error) {
      await source.client.query('ROLLBACK').catch(() => undefined);
      const busy = (error as { code?: string }).code === '55P03';
      if (!busy || attempt >= 10) throw Object.assign(error as Error, { side: source });
      await sleep(100);
    }
  }
}

/** Logical replication applies in commit order: once the fence marker is on the target, so is every earlier change. */
async function waitForCatchUp(ctx: MoveContext): Promise<void> {
  try {
    // A move fenced before markers were per attempt used the plain kind 'fenced'.
    await waitForMarker(ctx, ctx.fenceMarker ?? 'fenced', ctx.options.catchUpTimeoutMs ?? 30_000);
  } catch (error) {
    // Do not keep the shard unwritable while the target is stuck: unfence and let the operator retry.
    await unfence(ctx);
    await record(ctx, 'synced', 'running');
    throw new RuntimeFailure(
      'CATCH_UP_TIMEOUT',
      `host ${ctx.target.host.name}, shard ${ctx.shard}: the target did not apply the last changes within ${(ctx.options.catchUpTimeoutMs ?? 30_000) / 1000} s; the source was unfenced and is writable again. Run move-shard ${ctx.shard} --resume to retry the cut-over, or --abort. (${(error as Error).message})`,
    );
  }
}

async function waitForMarker(ctx: MoveContext, kind: string, timeoutMs: number): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    const r = await ctx.target.client.query(`SELECT 1 FROM ${CONTROL_SCHEMA}.move_markers WHERE move_id = $1 AND kind = $2`, [ctx.moveId, kind]);
    if (r.rowCount) return;
    if (performance.now() > deadline) throw new Error(`marker ${kind} not replicated within ${timeoutMs} ms`);
    await sleep(10);
  }
}

/** Offline: with the source fenced, stream every table with COPY into the target, in one target transaction. */
async function copyTables(ctx: MoveContext, snapshot?: string): Promise<void> {
  const { source, target, schema } = ctx;
  const tables = await shardTables(source.client, schema, 'leaves');
  const sameMajor = sameMajorVersion(ctx);
  const format = sameMajor ? '(FORMAT binary)' : '';
  await target.client.query('BEGIN');
  try {
    // Foreign keys between the shard's tables must not depend on the copy order.
    await target.client.query(`SET LOCAL session_replication_role = replica`).catch(async () => {
      await target.client.query('ROLLBACK');
      await target.client.query('BEGIN');
    });
    if (tables.length > 0) await target.client.query(`TRUNCATE ${tables.map((t) => `${quoteIdent(schema)}.${quoteIdent(t)}`).join(', ')}`);
    await source.client.query('BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY');
    if (snapshot) await source.client.query(`SET TRANSACTION SNAPSHOT ${quoteLiteral(snapshot)}`);
    for (const table of tables) {
      const name = `${quoteIdent(schema)}.${quoteIdent(table)}`;
      const out = source.client.query(copyStreams.to(`COPY ${name} TO STDOUT ${format}`));
      const into = target.client.query(copyStreams.from(`COPY ${name} FROM STDIN ${format}`));
      await pipeline(out, into);
    }
    await source.client.query('COMMIT');
    await target.client.query('COMMIT');
  } catch (error) {
    await source.client.query('ROLLBACK').catch(() => undefined);
    await target.client.query('ROLLBACK').catch(() => undefined);
    throw error;
  }
}

/**
 * Logical replication does not carry sequences. The target's sequences are set to at least the
 * source's, so every new id on the target is greater than every id of the shard (the sequence holds
 * next_id's position, and ids grow with it).
 */
async function carrySequences(ctx: MoveContext): Promise<void> {
  const r = await ctx.source.client.query<{ sequencename: string; last_value: string | null }>(
    `SELECT sequencename, last_value::text FROM pg_sequences WHERE schemaname = $1`,
    [ctx.schema],
  );
  for (const row of r.rows) {
    if (row.last_value === null) continue;
    const seq = `${quoteIdent(ctx.schema)}.${quoteIdent(row.sequencename)}`;
    await onSide(ctx.target, () =>
      ctx.target.client.query(
        `SELECT setval($1::regclass, greatest($2::bigint, coalesce((SELECT last_value FROM pg_sequences WHERE schemaname = $3 AND sequencename = $4), 0)), true)`,
        [seq, row.last_value, ctx.schema, row.sequencename],
      ),
    );
  }
}

async function verify(ctx: MoveContext): Promise<void> {
  const result = await verifyShard(ctx.source.client, ctx.target.client, ctx.schema, ctx.schema, {
    recordHash: Math.min(ctx.source.version, ctx.target.version) >= 140000,
  });
  ctx.verification = result;
  if (result.ok) return;
  // A mismatch aborts the cut-over: the source is unfenced and the move undone, nothing is lost.
  await abortMove(ctx, 'sequences-carried');
  throw new RuntimeFailure(
    'VERIFY_FAILED',
    `host ${ctx.target.host.name}, shard ${ctx.shard}: verification failed, the move was aborted and the source on ${ctx.source.host.name} is writable again:\n${result.mismatches.map((m) => `  - ${m}`).join('\n')}`,
    // Error data is printed as JSON: the row count (a bigint) as a decimal string, as in MoveResult.
    { moveId: ctx.moveId, verification: { ...result, rows: result.rows.toString() } },
    result.mismatches,
  );
}

/** The map now says target: its copy becomes active, and the config file is rewritten in place. */
async function switchMap(ctx: MoveContext): Promise<void> {
  await ctx.target.client.query(`UPDATE ${CONTROL_SCHEMA}.shards SET state = 'active' WHERE shard = $1`, [ctx.shard]);
  const file = ctx.options.configFile ?? ctx.config.file;
  await rewriteShardOwner(file, ctx.shard, ctx.source.host.name, ctx.target.host.name);
  if (ctx.fenceStartedAt !== null) ctx.writeBlockedMs = Math.round(performance.now() - ctx.fenceStartedAt);
}

/**
 * Replication objects removed; the old copy kept fenced under a new name until gc, or dropped.
 * Decided by the source's control row, not by what schemas exist: after the rename a schema of
 * views keeps the old name, so existence cannot tell a finished clean-up from an interrupted one.
 */
async function cleanUp(ctx: MoveContext): Promise<void> {
  await dropReplication(ctx);
  const { source, shard, schema } = ctx;
  const renamed = oldCopyName(schema, ctx.moveId);
  const row = await source.client.query<{ schema_name: string }>(`SELECT schema_name FROM ${CONTROL_SCHEMA}.shards WHERE shard = $1`, [shard]);
  const current = row.rows[0]?.schema_name;
  if (ctx.options.dropSource) {
    if (current !== undefined) {
      await source.client.query(dropShardSql(shard, [current, schema]));
    }
  } else if (current === schema) {
    await source.client.query(await renameWithStub(ctx, renamed));
  }
  for (const side of [ctx.source, ctx.target]) {
    await side.client.query(`DELETE FROM ${CONTROL_SCHEMA}.move_markers WHERE move_id = $1`, [ctx.moveId]);
  }
}

/**
 * The rename, and under the old name a view per table over the renamed copy, with the old schema's
 * and tables' grants: a client still on the old map gets SC100 for reads (the shard_moved guard)
 * and writes (writes through a simple view hit the base table's fence), not "does not exist" or
 * "permission denied", and reloads its map.
 */
async function renameWithStub(ctx: MoveContext, renamed: string): Promise<string> {
  const { source, shard, schema } = ctx;
  const tables = await shardTables(source.client, schema, 'all');
  const schemaGrants = await source.client.query<{ grantee: string | null; privilege_type: string }>(
    `SELECT r.rolname AS grantee, a.privilege_type FROM pg_namespace n, aclexplode(n.nspacl) a
       LEFT JOIN pg_roles r ON r.oid = a.grantee WHERE n.nspname = $1 AND a.grantee <> n.nspowner`,
    [schema],
  );
  const tableGrants = await source.client.query<{ relname: string; grantee: string | null; privilege_type: string }>(
    `SELECT c.relname, r.rolname AS grantee, a.privilege_type FROM pg_class c, aclexplode(c.relacl) a
       LEFT JOIN pg_roles r ON r.oid = a.grantee
      WHERE c.relnamespace = to_regnamespace($1) AND c.relkind IN ('r', 'p') AND a.grantee <> c.relowner`,
    [schema],
  );
  const to = (grantee: string | null): string => (grantee === null ? 'PUBLIC' : quoteIdent(grantee));
  const guard = `${quoteIdent(CONTROL_SCHEMA)}.shard_moved(${quoteLiteral(String(shard))}, ${quoteLiteral(ctx.target.host.name)})`;
  return [
    'BEGIN;',
    `ALTER SCHEMA ${quoteIdent(schema)} RENAME TO ${quoteIdent(renamed)};`,
    `CREATE SCHEMA ${quoteIdent(schema)};`,
    `COMMENT ON SCHEMA ${quoteIdent(schema)} IS ${quoteLiteral(`shardctl: shard ${shard} moved to ${ctx.target.host.name}; views over the fenced old copy ${renamed} until shardctl gc`)};`,
    ...tables.map(
      (t) => `CREATE VIEW ${quoteIdent(schema)}.${quoteIdent(t)} AS SELECT * FROM ${quoteIdent(renamed)}.${quoteIdent(t)} WHERE ${guard};`,
    ),
    ...schemaGrants.rows
      .filter((g) => g.privilege_type === 'USAGE')
      .map((g) => `GRANT USAGE ON SCHEMA ${quoteIdent(schema)} TO ${to(g.grantee)};`),
    ...tableGrants.rows
      .filter((g) => ['SELECT', 'INSERT', 'UPDATE', 'DELETE'].includes(g.privilege_type))
      .map((g) => `GRANT ${g.privilege_type} ON ${quoteIdent(schema)}.${quoteIdent(g.relname)} TO ${to(g.grantee)};`),
    `UPDATE ${CONTROL_SCHEMA}.shards SET schema_name = ${quoteLiteral(renamed)} WHERE shard = ${shard};`,
    'COMMIT;',
  ].join('\n');
}

async function dropReplication(ctx: MoveContext): Promise<void> {
  const { source, target, name } = ctx;
  const sub = await target.client.query(`SELECT 1 FROM pg_subscription WHERE subname = $1`, [name]);
  if (sub.rowCount) {
    try {
      await target.client.query(`DROP SUBSCRIPTION ${quoteIdent(name)}`);
    } catch {
      // The source is unreachable: detach the subscription from its slot, which is dropped below.
      await target.client.query(`ALTER SUBSCRIPTION ${quoteIdent(name)} DISABLE`);
      await target.client.query(`ALTER SUBSCRIPTION ${quoteIdent(name)} SET (slot_name = NONE)`);
      await target.client.query(`DROP SUBSCRIPTION ${quoteIdent(name)}`);
    }
  }
  await source.client.query(`DROP PUBLICATION IF EXISTS ${quoteIdent(name)}`);
  await dropSlot(ctx);
}

/** Drops the move's slot on the source if it exists; a slot still held by a dying walsender is waited for. */
async function dropSlot(ctx: MoveContext): Promise<void> {
  const { source, name } = ctx;
  for (let attempt = 0; attempt < 50; attempt++) {
    const slot = await source.client.query<{ active_pid: number | null }>(`SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1`, [name]);
    if (!slot.rowCount) return;
    const pid = slot.rows[0]!.active_pid;
    if (pid !== null) await source.client.query('SELECT pg_terminate_backend($1)', [pid]);
    else {
      await source.client.query('SELECT pg_drop_replication_slot($1)', [name]).catch(() => undefined);
    }
    await sleep(100);
  }
  throw new RuntimeFailure('SLOT_LEFT', `host ${source.host.name}: replication slot ${name} could not be dropped; drop it with pg_drop_replication_slot`);
}

async function unfence(ctx: MoveContext): Promise<void> {
  const { source, schema, shard } = ctx;
  const tables = await shardTables(source.client, schema, 'all');
  const drops = tables.map((t) => `DROP TRIGGER IF EXISTS shardctl_fence ON ${quoteIdent(schema)}.${quoteIdent(t)};`).join('\n');
  await source.client.query(
    `BEGIN;\n${drops}\nUPDATE ${CONTROL_SCHEMA}.shards SET state = 'active' WHERE shard = ${shard} AND state = 'fenced';\n` +
      `DELETE FROM ${CONTROL_SCHEMA}.move_markers WHERE move_id = ${quoteLiteral(ctx.moveId)} AND kind LIKE 'fenced%';\nCOMMIT;`,
  );
}

/**
 * Undoes a move that has not switched the map: no subscription, publication or slot left behind,
 * the source writable again, the target's copy dropped.
 */
async function abortMove(ctx: MoveContext, step: MoveStep): Promise<void> {
  const steps = stepsFor(ctx.mode);
  const onTarget = await ctx.target.client.query<{ state: string }>(`SELECT state FROM ${CONTROL_SCHEMA}.shards WHERE shard = $1`, [ctx.shard]);
  // The switch activates the target's copy before it rewrites the map and records the step: a run
  // killed in between left an active copy that the map may already name. Undoing the move then
  // would leave two writable copies.
  const switching = onTarget.rows[0]?.state === 'active';
  if (steps.indexOf(step) >= steps.indexOf('switched') || switching) {
    throw new RuntimeFailure(
      'MOVE_SWITCHED',
      `move ${ctx.moveId} already switched shard ${ctx.shard} to ${ctx.target.host.name}; it cannot be aborted. Run --resume to finish it, then move the shard back if needed.`,
    );
  }
  await dropReplication(ctx);
  await unfence(ctx);
  // Only a copy this move created (incoming, never active: see above) is dropped.
  await ctx.target.client.query(dropShardSql(ctx.shard, [ctx.schema]));
  for (const side of [ctx.source, ctx.target]) {
    await side.client.query(`DELETE FROM ${CONTROL_SCHEMA}.move_markers WHERE move_id = $1`, [ctx.moveId]);
  }
  await record(ctx, step, 'aborted');
}

export function oldCopyName(schema: string, moveId: string): string {
  return `${schema}_moved_${moveId}`.slice(0, 63);
}

function context(
  config: ShardctlConfig,
  shard: number,
  moveId: string,
  mode: MoveMode,
  sides: { source: Side; target: Side },
  migrations: readonly MigrationFile[],
  options: MoveOptions,
  detail: Record<string, unknown> = {},
): MoveContext {
  return {
    config,
    shard,
    schema: shardSchemaName(config, shard),
    moveId,
    mode,
    source: sides.source,
    target: sides.target,
    migrations,
    options,
    name: replicationName(moveId),
    fenceStartedAt: null,
    writeBlockedMs: null,
    verification: null,
    fenceMarker: typeof detail['fenceMarker'] === 'string' ? detail['fenceMarker'] : null,
  };
}

function result(ctx: MoveContext, outcome: MoveResult['outcome'], checks: readonly PreflightCheck[], started: number): MoveResult {
  return {
    moveId: ctx.moveId,
    shard: ctx.shard,
    source: ctx.source.host.name,
    target: ctx.target.host.name,
    mode: ctx.mode,
    outcome,
    preflight: checks,
    plan: stepsFor(ctx.mode),
    rowsMoved: (ctx.verification?.rows ?? 0n).toString(),
    writeBlockedMs: ctx.writeBlockedMs,
    durationMs: elapsed(started),
    verification: ctx.verification,
  };
}

function announce(ctx: MoveContext, step: MoveStep, detail: string): void {
  ctx.options.onStep?.(step, detail);
}

async function connectBoth(source: HostConfig, target: HostConfig): Promise<{ source: Side; target: Side }> {
  const [s, t] = await Promise.allSettled([
    connectHost(source, { applicationName: 'shardctl move' }),
    connectHost(target, { applicationName: 'shardctl move' }),
  ]);
  if (s.status === 'rejected' || t.status === 'rejected') {
    if (s.status === 'fulfilled') await s.value.end().catch(() => undefined);
    if (t.status === 'fulfilled') await t.value.end().catch(() => undefined);
    throw s.status === 'rejected' ? s.reason : (t as PromiseRejectedResult).reason;
  }
  const [sourceVersion, targetVersion] = await Promise.all([serverVersionNum(s.value), serverVersionNum(t.value)]);
  return {
    source: { host: source, client: s.value, version: sourceVersion },
    target: { host: target, client: t.value, version: targetVersion },
  };
}

async function serverVersionNum(client: pg.Client): Promise<number> {
  const result = await client.query<{ v: string }>(`SELECT current_setting('server_version_num') AS v`);
  return Number(result.rows[0]!.v);
}

async function lockBoth(sides: { source: Side; target: Side; lockTimeout?: string }): Promise<void> {
  const options = { workerWait: sides.lockTimeout };
  await acquireRunnerLock(sides.source.client, sides.source.host.name, options);
  if (sides.target.host.name !== sides.source.host.name) await acquireRunnerLock(sides.target.client, sides.target.host.name, options);
}

async function closeBoth(sides: { source: Side; target: Side }): Promise<void> {
  for (const side of [sides.source, sides.target]) {
    await releaseRunnerLock(side.client).catch(() => undefined);
    await side.client.end().catch(() => undefined);
  }
}

/** Runs a query and tags a failure with the side it happened on, for the message. */
async function onSide<T>(side: Side, fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (error) {
    throw Object.assign(error as Error, { side });
  }
}

/** Binary COPY and binary replication are safe only between equal major versions. */
function sameMajorVersion(ctx: MoveContext): boolean {
  return Math.floor(ctx.source.version / 10000) === Math.floor(ctx.target.version / 10000);
}

function newMoveId(): string {
  return `${Date.now().toString(36)}${randomBytes(3).toString('hex')}`;
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function elapsed(started: number): number {
  return Math.round(performance.now() - started);
}
