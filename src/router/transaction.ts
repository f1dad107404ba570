import type pg from 'pg';
import { shardSchemaName, type HostConfig, type ShardctlConfig } from '../config/types.js';
import { HostError } from '../errors.js';
import { describePgError } from '../fleet/connect.js';
import { behindPooler, hasSessionTimeouts, serverSession } from '../pg/pooler.js';
import { schemaSearchPath } from '../pg/quote.js';
import { DeferredBegin, TransactionStart, WRITE_LSN_SQL, type StartStatement } from './begin.js';
import { replicaCheckSql } from './replicas.js';
import { CommitUnknownError, isConnectionLoss } from './failover.js';
import type { RouterSettings } from './options.js';
import type { CallTrace } from './diagnostics.js';
import type { Attempt, RouterInternals, ShardFn, TransactionOptions, Via } from './types.js';

/** SQLSTATE idle_in_transaction_session_timeout. */
const IDLE_IN_TRANSACTION_TIMEOUT = '25P03';

/**
 * One shard's transaction on the router's paths: the statements that start it (built once per
 * shard and map) and one attempt of fn inside it, committed or rolled back.
 */

/** At most this many replica starts are kept per map (a few bounds over every shard of a large fleet). */
const MAX_REPLICA_STARTS = 65_536;

/** Per shard, the statements that start its transaction (read-write, read-only), for one map: a reload makes new ones. */
export class TransactionStarts {
  /** By kind (read-write, read-only; each with and without the timeouts' SET LOCALs), per shard. */
  private readonly starts = Array.from({ length: 4 }, () => new Map<number, TransactionStart>());

  /** Replica reads' starts (replicaStart), by shard and bound. */
  private readonly replicaStarts = new Map<string, TransactionStart>();

  constructor(
    private readonly config: ShardctlConfig,
    private readonly options: Pick<RouterSettings, 'statementTimeoutMs' | 'idleInTransactionTimeoutMs'>,
  ) {}

  /**
   * BEGIN [READ ONLY], the shard's search_path and the router's timeouts, built once per shard and
   * map. Everything is transaction-local: a pooled server connection (the router's own, or
   * PgBouncer's shared by other clients) is left with the server's settings when the call ends.
   * `sessionTimeouts`: the connection's session already has the router's timeouts (startup
   * parameters of a connection straight to the server, checked: pools.ts), so they are not set again.
   */
  transactionStart(shard: number, readOnly: boolean, sessionTimeouts = false): TransactionStart {
    const cache = this.starts[(readOnly ? 1 : 0) + (sessionTimeouts ? 2 : 0)]!;
    let start = cache.get(shard);
    if (!start) {
      const statements = this.startStatements(shard, readOnly, sessionTimeouts);
      // A read-write call that is one statement may go without a block (begin.ts, "Without BEGIN")
      // when nothing but its search_path needs setting: no SET LOCAL of a timeout among what it keeps.
      const implicit =
        !readOnly && statements.every((s, i) => i < 2 || s.openOnly === true)
          ? [`SET search_path TO ${schemaSearchPath(shardSchemaName(this.config, shard))}`]
          : undefined;
      start = new TransactionStart(statements, implicit);
      cache.set(shard, start);
    }
    return start;
  }

  /**
   * A read on a standby: the read-only start and the check of the standby (replicas.ts), built once
   * per shard, bound and map for reads that wait for no write; a read after a write's LSN has its own.
   */
  replicaStart(shard: number, read: { readonly maxLagMs: number; readonly afterLsn?: string }): TransactionStart {
    const build = (): TransactionStart =>
      new TransactionStart([...this.startStatements(shard, true), replicaCheckSql(shard, read)]);
    if (read.afterLsn !== undefined) return build();
    const key = `${shard}/${read.maxLagMs}`;
    let start = this.replicaStarts.get(key);
    if (!start) {
      start = build();
      // Bounds chosen per call could be any number: the cache stops growing rather than grow without end.
      if (this.replicaStarts.size < MAX_REPLICA_STARTS) this.replicaStarts.set(key, start);
    }
    return start;
  }

  /**
   * The start's statements. idle_in_transaction_session_timeout is open-only: a transaction that is
   * one round trip (its COMMIT in the same write) never waits for the client, so it is left out there.
   */
  startStatements(shard: number, readOnly: boolean, sessionTimeouts = false): StartStatement[] {
    const { statementTimeoutMs, idleInTransactionTimeoutMs } = sessionTimeouts ? {} : this.options;
    return [
      { sql: `BEGIN${readOnly ? ' READ ONLY' : ''}` },
      { sql: `SET LOCAL search_path TO ${schemaSearchPath(shardSchemaName(this.config, shard))}` },
      ...(statementTimeoutMs ? [{ sql: `SET LOCAL statement_timeout = ${statementTimeoutMs}` }] : []),
      ...(idleInTransactionTimeoutMs
        ? [{ sql: `SET LOCAL idle_in_transaction_session_timeout = ${idleInTransactionTimeoutMs}`, openOnly: true }]
        : []),
    ];
  }
}

/** What an attempt needs of the router. */
export type TransactionPaths = Pick<
  RouterInternals,
  'settings' | 'withConnection' | 'transactionStart' | 'wrote' | 'statementsShared' | 'learnStatementsShared'
>;

/**
 * What a named statement meets on a connection that a transaction pooler hands another server
 * connection from one transaction to the next: on one, another client's statement of that name
 * (42P05 duplicate_prepared_statement); on another, none of its own (26000 invalid_sql_statement_name).
 */
const POOLED_STATEMENT_CODES = new Set(['42P05', '26000']);

/**
 * One attempt of fn on `shard` of `host` (or `via`'s standby): fn's value once committed, or fn's
 * error once rolled back (the caller's loop decides whether to run it again); a COMMIT whose
 * answer was lost throws CommitUnknownError, never retried.
 *
 * Behind a transaction pooler (statementsShared: PgBouncer before 1.21 keeps no prepared statement
 * per client) fn's named statements are sent unnamed: planned again each time, but never missing or
 * another client's, and none is left on the pooler's server connections for its other clients. A
 * pooler the config does not declare is found when a connection is made (behindPooler: the
 * connection is marked), or shows itself when a named statement fails so: the transaction is rolled
 * back, the host is known as pooled from then on, and fn runs again, its statements unnamed.
 */
export function attempt<T>(
  paths: TransactionPaths,
  host: HostConfig,
  shard: number,
  fn: ShardFn<T>,
  options: TransactionOptions,
  trace?: CallTrace,
  via?: Via,
): Promise<Attempt<T>> {
  // Not an async function (a routed call's hot path): the first attempt's promise, looked at once.
  return attemptOnce(paths, host, shard, fn, options, trace, via).then((first) => {
    if (first.ok || !('pooled' in first)) return first;
    // From now on statementsShared(host): the next attempt sends them unnamed.
    paths.learnStatementsShared(host);
    // Seen by the call's subscribers as any other retried attempt (diagnostics.ts).
    trace?.retry(host.name, first.error);
    trace?.attempt(host.name);
    return attemptOnce(paths, host, shard, fn, options, trace, via);
  });
}

function attemptOnce<T>(
  paths: TransactionPaths,
  host: HostConfig,
  shard: number,
  fn: ShardFn<T>,
  options: TransactionOptions,
  trace?: CallTrace,
  via?: Via,
): Promise<Attempt<T> | { ok: false; error: unknown; pooled: true }> {
  const readOnly = options.readOnly ?? false;
  const tracking = !readOnly && paths.settings.trackWriteLsn === true;
  return paths.withConnection(
    host,
    shard,
    async (lease) => {
      const client = lease.client;
      const unnamed = paths.statementsShared(host) || behindPooler(client);
      // BEGIN and SET LOCAL go out with fn's first query, in the same write, and COMMIT too when
      // fn returns that query's promise (DeferredBegin).
      const begin = new DeferredBegin(
        client,
        via ? via.start(shard) : paths.transactionStart(shard, readOnly, hasSessionTimeouts(client)),
        tracking,
        unnamed,
        // What a call without a block leaves in the session (its search_path) must stay with this
        // connection, and the write LSN is read after a COMMIT.
        !via && !unnamed && !tracking && serverSession(client),
      );
      let value: T;
      try {
        const returned = fn(begin.callClient, shard);
        begin.returned(returned);
        value = await returned;
      } catch (thrown) {
        // The server's own reason when it ended the connection under fn (an idle-in-transaction
        // timeout, a shutdown), where fn's query only heard that the connection is not queryable.
        const error = lease.explain(thrown);
        begin.end();
        // The COMMIT went with fn's query, and the connection was lost before its answer.
        if (begin.commitSent && !options.readOnly && isConnectionLoss(error)) {
          lease.broken(error);
          throw new CommitUnknownError(
            host.name,
            shard,
            error,
            begin.withoutBlock ? 'the statement (which commits on its own, without a block)' : 'COMMIT',
          );
        }
        // fn gave up on a query that still runs (its own timeout, an abort): cancelled and the
        // connection dropped, rather than a ROLLBACK that waits behind that query.
        if (begin.open) await lease.rollbackAfterFailure(error);
        // A named statement met a pooler the config does not declare (see attempt): rolled back, run again.
        const code = (error as { code?: unknown } | null | undefined)?.code;
        if (begin.namedSent && typeof code === 'string' && POOLED_STATEMENT_CODES.has(code))
          return { ok: false, error, pooled: true };
        // Ended by the server for a reason of its own that no other host or connection changes
        // (say, fn idle in its transaction past idleInTransactionTimeoutMs): said with the host and
        // the shard, and not run again as a failover would be.
        const ended = error !== thrown || (error as { severity?: unknown } | null)?.severity === 'FATAL';
        if (ended && !isConnectionLoss(error)) return { ok: false, error: endedByServer(host, shard, error) };
        // The statement timeout (the router's statementTimeoutMs, or fn's own SET LOCAL): a failure
        // of the call at run time, said with the host and the shard; its code stays 57014.
        if (isStatementTimeout(error))
          return {
            ok: false,
            error: new HostError(
              host.name,
              `a statement ran past its statement_timeout${paths.settings.statementTimeoutMs ? ` (statementTimeoutMs: ${paths.settings.statementTimeoutMs} ms)` : ''}: ${describePgError(error)}; rolled back`,
              { shard, code: STATEMENT_TIMEOUT, cause: error },
            ),
          };
        // On a standby, the check that failed (replicas.ts) rather than fn's "transaction is aborted".
        return { ok: false, error: via ? (begin.error ?? error) : error };
      }
      begin.end();
      // fn ran no statement: no transaction was started, nothing to commit.
      if (!begin.started) return { ok: true, value };
      if (begin.error) throw begin.error;
      // Committed with fn's only query.
      if (begin.committed === 'COMMIT') {
        if (tracking) paths.wrote(host.name, begin.writeLsn);
        return { ok: true, value };
      }
      const commit =
        begin.committed !== undefined
          ? { command: begin.committed }
          : await commitOrDoubt(client, host, shard, tracking);
      if (tracking && commit.command === 'COMMIT') paths.wrote(host.name, commit.writeLsn);
      // COMMIT of a transaction in which a statement failed (fn caught the error) rolls back.
      if (commit.command === 'ROLLBACK') {
        throw new HostError(
          host.name,
          'the transaction was rolled back: a statement in it failed and fn caught the error',
          {
            shard,
            code: 'TRANSACTION_ABORTED',
          },
        );
      }
      return { ok: true, value };
    },
    via,
    trace,
  );
}

/** SQLSTATE query_canceled: the statement timeout's, and a cancel request's. */
const STATEMENT_TIMEOUT = '57014';

/** A statement that statement_timeout ended (not one cancelled by a request: the same SQLSTATE). */
function isStatementTimeout(error: unknown): boolean {
  const { code, message } = (error ?? {}) as { code?: unknown; message?: unknown };
  return code === STATEMENT_TIMEOUT && typeof message === 'string' && /statement timeout/.test(message);
}

/** The error of a transaction whose connection the server ended (Lease.explain), naming host and shard. */
function endedByServer(host: HostConfig, shard: number, error: unknown): HostError {
  const code = (error as { code?: unknown }).code;
  const why =
    code === IDLE_IN_TRANSACTION_TIMEOUT
      ? 'the server ended the transaction: fn left it idle longer than idleInTransactionTimeoutMs'
      : 'the server ended the connection during the transaction';
  return new HostError(host.name, `${why} (${describePgError(error)}); rolled back`, {
    shard,
    code: typeof code === 'string' ? code : 'CONNECTION_ENDED',
    cause: error,
  });
}

/** COMMIT on its own round trip; a connection lost before its answer leaves the outcome unknown. */
async function commitOrDoubt(
  client: pg.PoolClient,
  host: HostConfig,
  shard: number,
  readWriteLsn = false,
): Promise<{ command: string; writeLsn?: string }> {
  try {
    if (!readWriteLsn) return await client.query('COMMIT');
    // The WAL's end right after the COMMIT, in the same round trip (router.lastWriteLsn).
    const [commit, lsn] = (await client.query(`COMMIT;${WRITE_LSN_SQL}`)) as unknown as [
      pg.QueryResult,
      pg.QueryResult<{ lsn: string }>,
    ];
    return { command: commit.command, ...(lsn.rows[0] ? { writeLsn: lsn.rows[0].lsn } : {}) };
  } catch (error) {
    if (isConnectionLoss(error)) throw new CommitUnknownError(host.name, shard, error);
    throw error;
  }
}
