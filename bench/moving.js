/**
 * What the move benchmarks (move-shard, move-realworld, move-split, move-fleet) share: the application that
 * writes through a move, the `pg_dump -n … | psql` floor, and the checks that a move left nothing
 * of its replication behind. Each benchmark keeps only its scenario.
 */
import { existsSync } from 'node:fs';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { shardMovedTo } from '../dist/index.js';
import { binDirFor, clientVersion, connect, errorMessage, itemAt, timeCommand } from './lib.js';

/** @typedef {import('../dist/index.js').ShardMap} ShardMap */
/** @typedef {import('./lib.js').Host} Host */
/**
 * What the writer was acknowledged: per shard the write results in order, writes per host, fence
 * errors seen, the total and the longest gap between two acknowledgements.
 * @template A
 * @typedef {{
 *   acks: Map<number, A[]>,
 *   byHost: Map<string, number>,
 *   fenceErrors: number,
 *   total: number,
 *   longestGapMs: number,
 * }} Written
 */
/**
 * @template A
 * @typedef {{ stop: () => Promise<Written<A>> }} Writer
 */
/**
 * What `shardctl move-shard --json` prints: the move of a single source host, or the batch with
 * its moves.
 * @typedef {import('../dist/index.js').MoveResult | import('../dist/index.js').BatchMoveResult} CliMoveOutput
 */
/** One move step's line of progress and when it arrived. @typedef {import('./lib.js').TimedLine} TimedLine */

/** The writer runs this long before a timed side starts and after it ends: both hosts take its writes. */
export const WRITER_MARGIN_MS = 500;
/** The writer's back-off after a fence error before it retries on the reloaded map. */
const RETRY_MS = 5;

/**
 * The application: writes to `shards` in turn (shard = shards[n % shards.length], n = 1, 2, …),
 * each time on the host the map names, with `write(client, shard, n)`, whose result is what was
 * acknowledged. On the fence's SC100 it reloads the map and retries, as docs/moves.md tells
 * applications to. With `paceMs`, one write per that many ms at most; with `transaction`, a failed
 * write is rolled back first (write sends a whole transaction). Any other error stops it; stop()
 * rethrows it.
 * @template A
 * @param {ShardMap} map
 * @param {{
 *   shards: number[],
 *   write: (client: import('pg').Client, shard: number, n: number) => Promise<A>,
 *   paceMs?: number,
 *   retryMs?: number,
 *   transaction?: boolean,
 * }} options
 * @returns {Writer<A>}
 */
export function startWriter(map, { shards, write, paceMs = 0, retryMs = RETRY_MS, transaction = false }) {
  /** shard → acknowledged results, in order @type {Map<number, A[]>} */
  const acks = new Map(shards.map((s) => [s, []]));
  /** @type {Map<string, number>} */
  const byHost = new Map();
  /** @type {Map<string, import('pg').Client>} */
  const clients = new Map();
  let fenceErrors = 0;
  let total = 0;
  let longestGapMs = 0;
  /** @type {number | null} */
  let lastAck = null;
  let stopping = false;
  /** @type {unknown} */
  let failure = null;
  const loop = (async () => {
    for (let n = 1; !stopping; n++) {
      const started = performance.now();
      const shard = itemAt(shards, n % shards.length);
      const host = map.hostForShard(shard);
      let client = clients.get(host.name);
      if (!client) {
        client = await connect(host.url);
        clients.set(host.name, client);
      }
      try {
        const ack = await write(client, shard, n);
        const now = performance.now();
        if (lastAck !== null) longestGapMs = Math.max(longestGapMs, now - lastAck);
        lastAck = now;
        acks.get(shard)?.push(ack);
        byHost.set(host.name, (byHost.get(host.name) ?? 0) + 1);
        total += 1;
      } catch (error) {
        // Best effort: the session may be gone, and then there is nothing to roll back.
        if (transaction) await client.query('ROLLBACK').catch(() => undefined);
        if (!shardMovedTo(error)) throw error;
        fenceErrors += 1;
        await map.reload();
        if (retryMs > 0) await sleep(retryMs);
      }
      if (paceMs > 0) await sleep(Math.max(0, paceMs - (performance.now() - started)));
    }
  })().catch((error) => {
    // Kept for stop(): a rejection here would otherwise go unhandled while the move runs.
    failure = error;
  });
  return {
    async stop() {
      stopping = true;
      await loop;
      // Closing: an error here cannot change what was acknowledged.
      await Promise.all([...clients.values()].map((client) => client.end().catch(() => undefined)));
      if (failure) throw new Error(`the writer failed after ${total} acknowledged writes: ${errorMessage(failure)}`);
      return { acks, byHost, fenceErrors, total, longestGapMs };
    },
  };
}

/**
 * Runs `timed` with the writer running WRITER_MARGIN_MS before and after it; stops the writer
 * either way. Returns the timed side's result and what the writer was acknowledged.
 * @template A, R
 * @param {Writer<A>} writer
 * @param {() => Promise<R>} timed
 * @returns {Promise<{ result: R, written: Written<A> }>}
 */
export async function underWriter(writer, timed) {
  /** @type {R} */
  let result;
  try {
    await sleep(WRITER_MARGIN_MS);
    result = await timed();
    await sleep(WRITER_MARGIN_MS);
  } catch (error) {
    // The side's failure is the one to report; the writer's, if any, came from it.
    await writer.stop().catch(() => undefined);
    throw error;
  }
  return { result, written: await writer.stop() };
}

/**
 * The floor's pg_dump: --pg-dump, else the one of the server's major (Debian's layout), else
 * pg_dump on PATH. One older than the server refuses to dump it: then there is no floor here.
 * @param {string} major
 * @param {string} serverVersion
 * @param {{ pgDump?: string }} options
 * @returns {{ pgDump: string, version: string | null, skipped: string | null }}
 */
export function floorTools(major, serverVersion, options) {
  const binDir = binDirFor(major);
  const own = binDir && path.join(binDir, 'pg_dump');
  const pgDump = options.pgDump ?? (own && existsSync(own) ? own : 'pg_dump');
  const version = clientVersion(pgDump);
  if (version === null) {
    if (options.pgDump) throw new Error(`--pg-dump ${options.pgDump}: does not run (or is not PostgreSQL's pg_dump)`);
    return { pgDump, version, skipped: `${pgDump} does not run` };
  }
  const serverMajor = Number(serverVersion.split('.')[0]);
  if (Number(version.split('.')[0]) < serverMajor) {
    return {
      pgDump,
      version,
      skipped: `pg_dump ${version} (${pgDump}) refuses a PostgreSQL ${serverMajor} server; pass --pg-dump with a pg_dump ${serverMajor} or later`,
    };
  }
  return { pgDump, version, skipped: null };
}

/**
 * `pg_dump ARGS… | psql`, run by bash with pipefail so that either side failing fails the run. Each
 * side reads its own libpq settings (FROM_PG*, TO_PG*) from the environment: no password on a
 * command line. ON_ERROR_STOP: a restore that failed half-way must fail the run, not make it fast.
 */
const DUMP_RESTORE_SCRIPT = [
  'set -o pipefail',
  'dump=$1; restore=$2; shift 2',
  'PGHOST=$FROM_PGHOST PGPORT=$FROM_PGPORT PGUSER=$FROM_PGUSER PGPASSWORD=$FROM_PGPASSWORD PGDATABASE=$FROM_PGDATABASE "$dump" "$@" |' +
    ' PGHOST=$TO_PGHOST PGPORT=$TO_PGPORT PGUSER=$TO_PGUSER PGPASSWORD=$TO_PGPASSWORD PGDATABASE=$TO_PGDATABASE "$restore" -q -X -v ON_ERROR_STOP=1 >/dev/null',
].join('\n');
const LIBPQ_SETTINGS = ['PGHOST', 'PGPORT', 'PGUSER', 'PGPASSWORD', 'PGDATABASE'];

/**
 * The floor as a DBA types it, `pg_dump -n s1 -n s2 … | psql`, from `sourceDb` on the source into
 * `targetDb` on the target, created empty first; wall time in ms. Before it, untimed, the control
 * schema's definitions (no rows): a shard's next_id() calls the host's slow path there (next_id v2,
 * bound when the function is created), so a restored shard needs it first, as a DBA restoring one
 * onto another host would.
 * @param {{
 *   source: Host,
 *   sourceDb: string,
 *   target: Host,
 *   targetDb: string,
 *   schemas: string[],
 *   pgDump: string,
 *   psql: string,
 * }} options
 */
export async function timeDumpRestore({ source, sourceDb, target, targetDb, schemas, pgDump, psql }) {
  await target.resetDatabase(targetDb);
  /**
   * @param {string} prefix
   * @param {NodeJS.ProcessEnv} env
   */
  const side = (prefix, env) => Object.fromEntries(LIBPQ_SETTINGS.map((name) => [`${prefix}_${name}`, env[name]]));
  const env = { ...process.env, ...side('FROM', source.psqlEnv(sourceDb)), ...side('TO', target.psqlEnv(targetDb)) };
  /**
   * @param {string[]} dumpArgs
   * @param {string} what
   */
  const dumpRestore = async (dumpArgs, what) => {
    const timed = await timeCommand('bash', ['-c', DUMP_RESTORE_SCRIPT, 'bash', pgDump, psql, ...dumpArgs], { env });
    if (timed.code !== 0) {
      throw new Error(
        `pg_dump ${what} | psql exited ${timed.code}:\n${timed.stderr.trimEnd().split('\n').slice(-20).join('\n')}`,
      );
    }
    return timed.ms;
  };
  await dumpRestore(['--schema-only', '-n', 'shardctl'], '--schema-only -n shardctl');
  return dumpRestore(
    schemas.flatMap((s) => ['-n', s]),
    schemas.length === 1 ? `-n ${schemas[0]}` : `of ${schemas.length} schemas`,
  );
}

/**
 * Rows of `table` summed over `schemas` on one host, in one statement.
 * @param {Host} host
 * @param {string} database
 * @param {string[]} schemas
 * @param {string} [table]
 */
export async function countRows(host, database, schemas, table = 'photos') {
  const [row] = await host.query(
    database,
    `select coalesce(sum((xpath('/row/n/text()', query_to_xml(format('select count(*) as n from %I.%I', s, $2::text), false, true, '')))[1]::text::bigint), 0)::bigint as n
       from unnest($1::text[]) s`,
    [schemas, table],
  );
  return Number(row?.n);
}

/**
 * Publications, subscriptions and slots of shardctl on the host; a finished move leaves none.
 * @param {Host} host
 * @param {string} database
 */
export async function replicationObjectsLeft(host, database) {
  const [left] = await host.query(
    database,
    `select (select count(*) from pg_publication where pubname like 'shardctl\\_%')
          + (select count(*) from pg_subscription where subname like 'shardctl\\_%')
          + (select count(*) from pg_replication_slots where slot_name like 'shardctl\\_%') as n`,
  );
  return Number(left?.n);
}

/**
 * The steps of a move from the fence to the switch, as `done: <step>[ (wave k of n)]` lines
 * (the CLI's progress on stderr, or onStep's detail) with the time each arrived, per wave: the
 * ms each step took after the previous one, and the whole fenced → switched.
 */
export const FENCED_STEPS = ['fenced', 'caught-up', 'sequences-carried', 'verified', 'switched'];

/**
 * @param {TimedLine[]} lines
 * @returns {{ wave: number, fencedMs: number | null, steps: Record<string, number> }[]}
 */
export function fencedStepsByWave(lines) {
  /** wave → step → ms since the spawn @type {Map<number, Record<string, number>>} */
  const waves = new Map();
  for (const { text, atMs } of lines) {
    const match = /done: ([a-z-]+)(?: \(wave (\d+) of \d+\))?/.exec(text);
    const step = match?.[1];
    if (!match || step === undefined || !FENCED_STEPS.includes(step)) continue;
    const wave = Number(match[2] ?? 1);
    const at = waves.get(wave) ?? {};
    at[step] = atMs;
    waves.set(wave, at);
  }
  return [...waves.entries()].map(([wave, at]) => {
    /** @type {Record<string, number>} */
    const steps = {};
    for (let i = 1; i < FENCED_STEPS.length; i++) {
      const [before, step] = [itemAt(FENCED_STEPS, i - 1), itemAt(FENCED_STEPS, i)];
      const [beforeMs, stepMs] = [at[before], at[step]];
      if (stepMs !== undefined && beforeMs !== undefined) steps[step] = Math.round(stepMs - beforeMs);
    }
    const fencedMs = at.fenced !== undefined && at.switched !== undefined ? Math.round(at.switched - at.fenced) : null;
    return { wave, fencedMs, steps };
  });
}
