/**
 * Reads from a host's standbys (`{ readOnly: true, replica: true }`), with read-your-writes when
 * asked.
 *
 * Which addresses are standbys: those of the host's own URL (libpq multi-host syntax,
 * src/pg/multihost.ts) whose server says it is in recovery. They are found by connecting to each
 * address once (StandbyBook), and found again every `STANDBY_REFRESH_MS` and after a standby failed.
 * pg_stat_replication on the primary is not used: its client_addr is the address a standby connects
 * *from*, not one a client can connect *to* (no port, and a NAT or a proxy in between), so it
 * cannot be mapped to a URL without guessing.
 *
 * Every replica transaction starts with a check on the standby itself (`replicaCheckSql`, one plain
 * SELECT sent in the same round trip as BEGIN and the search_path, so it costs no round trip of its
 * own), which refuses the read with an error naming a reason:
 *
 *   not-standby  the server is not in recovery (promoted since it was found)
 *   no-receiver  no WAL receiver runs (the standby lost its primary: it may be any age behind)
 *   behind       it has not replayed `afterLsn` (a write the caller wants to see)
 *   lagging      WAL it received is not replayed yet, and the last transaction it replayed
 *                committed more than `maxLagMs` ago (an idle primary that sent nothing new is not
 *                lag: received = replayed means there is nothing to catch up on)
 *   not-active   its copy of the control schema does not say the shard is active here (fenced by a
 *                move, incoming, or gone): the shard is read from its current holder instead
 *
 * A refusal sends the call to the primary (behind: after waiting up to `replicaWaitMs` for the
 * standby to replay the LSN, polling pg_last_wal_replay_lsn(); PostgreSQL 15-18 have no function
 * that waits), and router.stats() counts why. fn itself runs in READ COMMITTED, as on the primary:
 * each of its statements takes a snapshot after the check, so a snapshot that includes the LSN
 * checked.
 *
 * A moved shard: its old holder's standby replays the fence and the switch as the old holder ran
 * them, so it refuses the shard (not-active) once it has replayed the fence, and until then is at
 * most `maxLagMs` behind like any other read, or `behind` a write the caller made on the new holder
 * (an LSN of another host is never compared: the call goes to the primary, `moved`).
 */
import pg from 'pg';
import type { HostConfig } from '../config/types.js';
import { UsageError } from '../errors.js';
import { connectOnce, parsedHostUrl } from '../fleet/connect.js';
import { CONTROL } from '../fleet/control.js';
import { hostClientSettings, silenceAfterMs, watchSilence } from '../fleet/silence.js';
import { SESSION_STATE_SQL, singleAddressUrls } from '../pg/multihost.js';
import { endQuietly } from '../pg/quiet.js';
import { registerUrlSecret } from '../pg/redact.js';
import { inspectConnection } from '../pg/pooler.js';
import { libpqCompatible } from '../pg/tls.js';

/** The SQLSTATE of a replica's refusal (replicaCheckSql: invalid_text_representation, from its cast). */
export const REPLICA_REFUSED = '22P02';

/** Why a replica read ran on the primary instead (router.stats(), the call's event). */
export const REPLICA_FALLBACKS = [
  'no-standby',
  'unreachable',
  'not-standby',
  'no-receiver',
  'behind',
  'lagging',
  'not-active',
  'moved',
  'conflict',
] as const;
export type ReplicaFallback = (typeof REPLICA_FALLBACKS)[number];

/** Default of maxLagMs. */
export const DEFAULT_MAX_LAG_MS = 1000;
/** Default of replicaWaitMs. */
export const DEFAULT_REPLICA_WAIT_MS = 100;
/** How often a host's standbys are looked for again (and at most how often after one failed). */
export const STANDBY_REFRESH_MS = 5000;
/** Between two reads of a standby's replay position while a call waits for it. */
const REPLAY_POLL_MS = 5;

/** An LSN after a write on a host (router.lastWriteLsn), to read a replica only once it is replayed. */
export interface WriteLsn {
  /** The host the write committed on. */
  readonly host: string;
  /** PostgreSQL's text form, e.g. '0/3000148'. */
  readonly lsn: string;
}

/** The options of a read that may run on a standby. */
export interface ReplicaReadOptions {
  /** Run on a standby of the shard's host when one qualifies (needs readOnly: true). */
  replica?: boolean;
  /** The most replay lag accepted, in ms (see the header). Default 1000; 0: fully replayed only. */
  maxLagMs?: number;
  /** A write this read must see (router.lastWriteLsn(shard)); undefined: none. */
  afterLsn?: WriteLsn | undefined;
  /** How long to wait for a standby to replay afterLsn before reading the primary. Default 100 ms. */
  replicaWaitMs?: number;
}

/** Every key of ReplicaReadOptions (the compiler checks the record is whole), for the options of the calls that take them. */
export const REPLICA_READ_FLAGS: { readonly [K in keyof Required<ReplicaReadOptions>]: true } = {
  replica: true,
  maxLagMs: true,
  afterLsn: true,
  replicaWaitMs: true,
};

/** Validated replica options of one call. */
export interface ReplicaRead {
  readonly maxLagMs: number;
  readonly afterLsn: WriteLsn | undefined;
  readonly waitMs: number;
}

const LSN = /^([0-9A-Fa-f]{1,8})\/([0-9A-Fa-f]{1,8})$/;

/** An LSN's text form as a number (for comparing); undefined when it is not one. */
export function parseLsn(text: string): bigint | undefined {
  const match = LSN.exec(text);
  if (!match) return undefined;
  return (BigInt(`0x${match[1]!}`) << 32n) | BigInt(`0x${match[2]!}`);
}

/** The text form PostgreSQL writes for an LSN. */
export function formatLsn(lsn: bigint): string {
  return `${(lsn >> 32n).toString(16).toUpperCase()}/${(lsn & 0xffffffffn).toString(16).toUpperCase()}`;
}

/**
 * The replica options of a call, checked: undefined when the call does not ask for a replica. A
 * UsageError names the field and the value (every problem at once).
 */
export function replicaRead(options: ReplicaReadOptions & { readOnly?: boolean }): ReplicaRead | undefined {
  const problems: string[] = [];
  const { replica, maxLagMs, afterLsn, replicaWaitMs } = options;
  if (replica !== undefined && typeof replica !== 'boolean')
    problems.push(`replica ${JSON.stringify(replica)}: must be true or false`);
  const wholeMs = (name: string, value: unknown): void => {
    if (value !== undefined && (typeof value !== 'number' || !Number.isSafeInteger(value) || value < 0))
      problems.push(`${name} ${JSON.stringify(value)}: must be a whole number of milliseconds`);
  };
  wholeMs('maxLagMs', maxLagMs);
  wholeMs('replicaWaitMs', replicaWaitMs);
  if (afterLsn !== undefined) {
    const lsn = (afterLsn as { lsn?: unknown } | null)?.lsn;
    const host = (afterLsn as { host?: unknown } | null)?.host;
    if (typeof host !== 'string' || typeof lsn !== 'string' || parseLsn(lsn) === undefined)
      problems.push(
        `afterLsn ${JSON.stringify(afterLsn)}: must be what router.lastWriteLsn(shard) returned ({ host, lsn: 'X/Y' })`,
      );
  }
  if (replica === true && options.readOnly !== true)
    problems.push('replica true: needs readOnly: true (a standby cannot write)');
  if (replica !== true) {
    for (const [name, value] of [
      ['maxLagMs', maxLagMs],
      ['afterLsn', afterLsn],
      ['replicaWaitMs', replicaWaitMs],
    ] as const)
      if (value !== undefined) problems.push(`${name} ${JSON.stringify(value)}: applies only with replica: true`);
  }
  if (problems.length > 0) throw new UsageError(problems.join('; '), { data: { problems } });
  if (replica !== true) return undefined;
  return {
    maxLagMs: maxLagMs ?? DEFAULT_MAX_LAG_MS,
    afterLsn,
    waitMs: replicaWaitMs ?? DEFAULT_REPLICA_WAIT_MS,
  };
}

/**
 * The check a replica transaction starts with, after BEGIN and the search_path (see the header):
 * one plain SELECT (a DO block would have PL/pgSQL compile its body on every call). It returns no row when the standby will do; otherwise it fails on casting
 * `'shardctl-replica <reason>'` to an integer (SQLSTATE 22P02, the text quoted in the message),
 * which ends the transaction before fn's query runs, as a raised error would. The reason is computed
 * in a subquery kept apart (OFFSET 0), so that the cast is evaluated once, after it, and never
 * folded at plan time. The shard, the bound and the LSN are validated numbers written as literals:
 * the statement travels in the same round trip as BEGIN, as a simple query too (script.ts), where no
 * parameter can be bound; the router builds it once per shard and bound (transaction.ts).
 */
export function replicaCheckSql(shard: number, read: Pick<ReplicaRead, 'maxLagMs'> & { afterLsn?: string }): string {
  if (!Number.isSafeInteger(shard) || shard < 0) throw new RangeError(`shard ${shard} is not a shard number`);
  if (!Number.isSafeInteger(read.maxLagMs) || read.maxLagMs < 0)
    throw new RangeError(`maxLagMs ${read.maxLagMs} is not a whole number of milliseconds`);
  const lsn = read.afterLsn !== undefined ? parseLsn(read.afterLsn) : undefined;
  if (read.afterLsn !== undefined && lsn === undefined) throw new RangeError(`afterLsn ${read.afterLsn} is not an LSN`);
  const when = (reason: ReplicaFallback, condition: string): string => `WHEN ${condition} THEN '${reason}'`;
  return [
    `SELECT CAST('${REFUSAL_PREFIX}' || refused AS integer) FROM (SELECT CASE`,
    when('not-standby', 'NOT pg_catalog.pg_is_in_recovery()'),
    // The view's function, not the view: its pid is what the view filters on, and planning the
    // view's columns cost more than the rest of the check.
    when('no-receiver', '(pg_catalog.pg_stat_get_wal_receiver()).pid IS NULL'),
    ...(lsn !== undefined ? [when('behind', `pg_catalog.pg_last_wal_replay_lsn() < '${formatLsn(lsn)}'::pg_lsn`)] : []),
    when(
      'lagging',
      `pg_catalog.pg_last_wal_receive_lsn() > pg_catalog.pg_last_wal_replay_lsn() AND COALESCE(pg_catalog.clock_timestamp() - pg_catalog.pg_last_xact_replay_timestamp() > interval '${read.maxLagMs} milliseconds', true)`,
    ),
    when('not-active', `NOT EXISTS (SELECT FROM ${CONTROL}.shards WHERE shard = ${shard} AND state = 'active')`),
    `END AS refused OFFSET 0) AS shardctl_replica WHERE refused IS NOT NULL`,
  ].join('\n');
}

/** What a refusal's text starts with (replicaCheckSql); the reason follows. */
const REFUSAL_PREFIX = 'shardctl-replica ';

/** The reason of a replica's refusal, or undefined for any other error. */
export function replicaRefusal(error: unknown): ReplicaFallback | undefined {
  const e = error as { code?: unknown; message?: unknown } | null;
  if (e?.code !== REPLICA_REFUSED || typeof e.message !== 'string') return undefined;
  // The message is translated under lc_messages; the quoted text is not.
  const reason = /"shardctl-replica ([a-z-]+)"/.exec(e.message)?.[1];
  return (REPLICA_FALLBACKS as readonly string[]).includes(reason ?? '') ? (reason as ReplicaFallback) : undefined;
}

/**
 * A read a hot standby cancelled because replay needed what it held (SQLSTATE 40001 "conflict with
 * recovery"): read-only, so it runs again on the primary.
 */
export function isRecoveryConflict(error: unknown): boolean {
  const e = error as { code?: unknown; message?: unknown } | null;
  return e?.code === '40001' && typeof e.message === 'string' && /conflict with recovery/.test(e.message);
}

/** A standby of a host: its address and its pool. */
export interface Standby {
  readonly url: string;
  readonly pool: pg.Pool;
}

export interface StandbyBookOptions {
  readonly applicationName: string;
  readonly connectTimeoutMs: number;
  readonly poolSize: number;
  readonly idleTimeoutMs: number;
  /** The router's statementTimeoutMs: a standby's silence is noticed sooner under it (silenceAfterMs). */
  readonly statementTimeoutMs?: number | undefined;
}

interface HostStandbys {
  readonly hostUrl: string;
  /** The last search's standbys (less those that failed since). */
  standbys: Standby[];
  /** When the last search started. */
  at: number;
  /** A search under way. */
  finding: Promise<void> | undefined;
  /** A search has ended (its standbys are known). */
  searched: boolean;
  next: number;
}

/**
 * Per host, its standbys (the URL's addresses in recovery), each with a pool, taken in turn. Found
 * on first use (that call waits), then again in the background every STANDBY_REFRESH_MS, the calls
 * meanwhile using what the last search found.
 */
export class StandbyBook {
  private readonly hosts = new Map<string, HostStandbys>();
  private closed = false;

  constructor(private readonly options: StandbyBookOptions) {}

  /** A standby of `host` to read from, in turn; undefined when it has none (or none was found). */
  async pick(host: HostConfig): Promise<Standby | undefined> {
    let entry = this.hosts.get(host.name);
    if (!entry || entry.hostUrl !== host.url) {
      if (entry) for (const old of entry.standbys) void endQuietly(old.pool);
      entry = { hostUrl: host.url, standbys: [], at: 0, finding: undefined, searched: false, next: 0 };
      this.hosts.set(host.name, entry);
      this.refresh(host, entry);
    } else if (Date.now() - entry.at >= STANDBY_REFRESH_MS) {
      this.refresh(host, entry);
    }
    // Before the first search ends, every call waits for it (none is sent to the primary for want of it).
    if (!entry.searched) await entry.finding;
    const standbys = entry.standbys;
    if (standbys.length === 0) return undefined;
    entry.next = (entry.next + 1) % standbys.length;
    return standbys[entry.next];
  }

  /** `standby` failed or is no longer one: not used until a search finds it again. */
  failed(hostName: string, standby: Standby): void {
    const entry = this.hosts.get(hostName);
    if (entry) entry.standbys = entry.standbys.filter((s) => s !== standby);
  }

  /** Waits until `standby` has replayed `lsn` (true) or `deadline` passes (false). */
  async replayed(standby: Standby, lsn: string, deadline: number): Promise<boolean> {
    for (;;) {
      const r = await standby.pool.query<{ ok: boolean }>(
        'SELECT pg_catalog.pg_last_wal_replay_lsn() >= $1::pg_lsn AS ok',
        [lsn],
      );
      if (r.rows[0]?.ok === true) return true;
      if (Date.now() + REPLAY_POLL_MS > deadline) return false;
      await new Promise((resolve) => setTimeout(resolve, REPLAY_POLL_MS));
    }
  }

  async close(): Promise<void> {
    this.closed = true;
    const entries = [...this.hosts.values()];
    await Promise.all(entries.map((e) => e.finding ?? Promise.resolve()));
    this.hosts.clear();
    await Promise.all(entries.flatMap((e) => e.standbys).map((s) => endQuietly(s.pool)));
  }

  private refresh(host: HostConfig, entry: HostStandbys): void {
    if (entry.finding || this.closed) return;
    entry.at = Date.now();
    entry.finding = this.find(host, entry).finally(() => {
      entry.finding = undefined;
      entry.searched = true;
    });
  }

  /** The host's addresses in recovery; a standby found again keeps its pool. */
  private async find(host: HostConfig, entry: HostStandbys): Promise<void> {
    let urls: string[];
    try {
      urls = singleAddressUrls(parsedHostUrl(host));
    } catch {
      urls = [];
    }
    const states = urls.length > 1 ? await Promise.all(urls.map((url) => this.inRecovery(host, url))) : [];
    if (this.closed || this.hosts.get(host.name) !== entry) return;
    const before = entry.standbys;
    const found = urls
      .filter((_, i) => states[i] === true)
      .map((url) => before.find((s) => s.url === url) ?? this.standbyPool(host, url));
    for (const old of before) if (!found.includes(old)) void endQuietly(old.pool);
    entry.standbys = found;
  }

  private async inRecovery(host: HostConfig, url: string): Promise<boolean> {
    let client: pg.Client | undefined;
    try {
      client = await connectOnce(host, url, this.options);
      const r = await client.query<{ in_recovery: boolean }>(SESSION_STATE_SQL);
      return r.rows[0]?.in_recovery === true;
    } catch {
      return false;
    } finally {
      if (client) await endQuietly(client);
    }
  }

  private standbyPool(host: HostConfig, url: string): Standby {
    registerUrlSecret(url);
    const pool = new pg.Pool({
      connectionString: libpqCompatible(url),
      max: this.options.poolSize,
      application_name: this.options.applicationName,
      ...hostClientSettings(host),
      connectionTimeoutMillis: Math.min(this.options.connectTimeoutMs, host.timeoutMs),
      idleTimeoutMillis: this.options.idleTimeoutMs,
      // A standby behind a pooler of its own: its connections are marked, and fn's named statements
      // go unnamed there (transaction.ts). pg-pool waits for the promise; its types say void.
      // eslint-disable-next-line @typescript-eslint/no-misused-promises
      onConnect: (client: pg.ClientBase) => inspectConnection(client),
    });
    // An idle standby connection whose server goes away: dropped by the pool, not an unhandled error.
    pool.on('error', () => undefined);
    // As the primary's pools: a standby that stops answering, or a connection to it lost on the way
    // (a NAT that dropped the flow), fails the read waiting on it within the host's timeout, and the
    // read goes to the primary. The address probed is the standby's own.
    const watched = { ...host, url };
    const silenceMs = silenceAfterMs(host, this.options.statementTimeoutMs);
    pool.on('connect', (client) => watchSilence(client, watched, silenceMs));
    return { url, pool };
  }
}
