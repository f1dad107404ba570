/**
 * failover: how long a router's writes stop when its host fails over (issue 41). Per run, a fresh
 * primary and a streaming standby made from it by `pg_basebackup -R` (PostgreSQL 15 from
 * /usr/lib/postgresql/15/bin: the embedded binaries have no pg_basebackup), a fleet of 4 shards on
 * that one host whose URL lists both addresses, and 4 callers writing single rows through
 * `router.withKey` with no pause. Then the primary is stopped with `-m immediate` and the standby
 * promoted (`pg_ctl promote`), as a failover manager does; nobody calls `reload()`.
 *
 * Per run: the time from the start of `pg_ctl promote` to the first routed write that succeeds
 * after it, and the calls that failed (COMMIT_UNKNOWN is the only failure the router should let
 * through). Target: median ≤ 2 s (the issue's, on this machine's loopback).
 */
import { ShardRouter } from '../dist/index.js';
import { formatMs, log, summarize, verdict, writeFleet } from './lib.js';
import { init, loadConfig } from '../dist/index.js';
import { standbyPairSection, startPrimaryWithStandby } from './standby.js';

export const description = 'time from pg_ctl promote to the first routed write on the new primary (PG 15 standby)';

const CALLERS = 4;
const TARGET_MS = 2000;
const SHARDS = 4;

/** @param {string} major */
async function oneFailover(major) {
  const pair = await startPrimaryWithStandby(major, 'failover', 'bench_failover');
  /** @type {ShardRouter | undefined} */
  let router;
  /** @type {import('./lib.js').Fleet<import('./lib.js').FleetHost> | undefined} */
  let fleet;
  try {
    fleet = await writeFleet({ name: 'failover', hosts: [pair.host], shards: SHARDS, database: 'bench_failover' });
    if (!(await init(await loadConfig(fleet.configFile))).ok) throw new Error('init failed');
    const opened = await ShardRouter.open(fleet.configFile, { poolSize: CALLERS, connectTimeoutMs: 2000 });
    router = opened;

    /** @type {number[]} */
    const successes = [];
    /** @type {string[]} */
    const failures = [];
    let writing = true;
    let key = 0n;
    const callers = Array.from({ length: CALLERS }, async () => {
      while (writing) {
        key += 1n;
        try {
          await opened.withKey(key, (client) =>
            client.query('INSERT INTO photos (user_id, image_url) VALUES ($1, $2)', [key.toString(), 'x']),
          );
          successes.push(performance.now());
        } catch (error) {
          failures.push(failureCode(error));
          await new Promise((resolve) => setTimeout(resolve, 10));
        }
      }
    });
    await new Promise((resolve) => setTimeout(resolve, 1000));
    await pair.stopPrimary();
    const promotedAt = performance.now();
    await pair.promote();
    const promotedBy = performance.now();
    while (!successes.some((t) => t >= promotedAt) && performance.now() - promotedAt < 30_000)
      await new Promise((resolve) => setTimeout(resolve, 5));
    await new Promise((resolve) => setTimeout(resolve, 500));
    writing = false;
    await Promise.all(callers);
    const first = successes.find((t) => t >= promotedAt);
    return {
      firstWriteMs: first === undefined ? Infinity : first - promotedAt,
      promoteMs: promotedBy - promotedAt,
      failed: failures.length,
      failureCodes: [...new Set(failures)],
    };
  } finally {
    await router?.close();
    await fleet?.remove();
    await pair.dispose();
  }
}

/**
 * What a failed call is counted as: its SQLSTATE or the router's code, else its message.
 * @param {unknown} error
 */
function failureCode(error) {
  if (error instanceof Error) return String(/** @type {{ code?: unknown }} */ (error).code ?? error.message);
  return String(error);
}

/**
 * @param {import('./run.js').BenchContext} ctx
 * @param {string} major
 */
export async function run(ctx, major) {
  const runs = [];
  for (let i = 0; i < ctx.options.failoverRuns; i++) {
    const result = await oneFailover(major);
    log(
      `  failover ${i + 1}: first write ${formatMs(result.firstWriteMs)} after promote began (promote took ${formatMs(result.promoteMs)}), ${result.failed} failed calls`,
    );
    runs.push(result);
  }
  const firstWrite = summarize(runs.map((r) => r.firstWriteMs));
  return {
    benchmark: 'failover',
    major,
    callers: CALLERS,
    runs,
    firstWrite,
    promote: summarize(runs.map((r) => r.promoteMs)),
    failed: runs.reduce((n, r) => n + r.failed, 0),
    failureCodes: [...new Set(runs.flatMap((r) => r.failureCodes))],
    pass: firstWrite.median <= TARGET_MS,
  };
}

const HEADERS = ['measure', 'median', 'min', 'max', 'runs'];

/** @typedef {Awaited<ReturnType<typeof run>>} FailoverResult */

/** @param {FailoverResult} result */
function rows(result) {
  return [
    [
      'promote → first routed write',
      formatMs(result.firstWrite.median),
      formatMs(result.firstWrite.min),
      formatMs(result.firstWrite.max),
      String(result.runs.length),
    ],
    [
      'pg_ctl promote -w itself',
      formatMs(result.promote.median),
      formatMs(result.promote.min),
      formatMs(result.promote.max),
      String(result.runs.length),
    ],
  ];
}

/** @param {FailoverResult} result */
function footer(result) {
  return `${result.callers} callers; failed calls over all runs: ${result.failed}${result.failureCodes.length ? ` (${result.failureCodes.join(', ')})` : ''}. Target (median ≤ 2 s): ${verdict(result.pass)}`;
}

const section = standbyPairSection({ name: 'failover', shards: SHARDS, headers: HEADERS, rows, footer });

/** The text table of one run. */
export const table = section.table;

/** The markdown of the runs, one section per PostgreSQL major. */
export const markdown = section.markdown;
