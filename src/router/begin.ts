import { createRequire } from 'node:module';
import pg from 'pg';
import { UsageError } from '../errors.js';
import { blockNeutral, firstEscape } from '../pg/statements.js';

/**
 * A transaction whose BEGIN travels with fn's first statement, and whose COMMIT does too when that
 * statement is all fn does.
 *
 * withShard's transaction starts with `BEGIN` and `SET LOCAL search_path`. Sent on their own they
 * cost a round trip before fn's first statement can leave, and the COMMIT after it another: three
 * for a one-row insert, where a plain pool needs one. Here nothing is sent until fn's first query,
 * and that query goes out in the same write as the two statements before it:
 *
 *   Parse/Bind/Execute `BEGIN`, Parse/Bind/Execute `SET LOCAL search_path TO …`, then the query's
 *   own Parse/Bind/Describe/Execute, [Parse/Bind/Execute `COMMIT`], and one Sync
 *
 * The server runs them in order as one pipeline. The extra CommandComplete messages are dropped, so
 * fn sees its query's result alone.
 *
 * The COMMIT is added when fn returned, synchronously, the very promise of that first query (as
 * `(client) => client.query(…)` does) and started no other query: then that query is all of fn's
 * work, and fn's value is its result. The write is held back to the end of the current tick (a microtask) to see what fn
 * returned; nothing else can be sent on the connection meanwhile, because the query is the
 * connection's active one. The whole call is then one round trip, like a plain pool's autocommit
 * statement, and still one transaction with the shard's search_path; it leaves out the start's
 * statements only an open transaction needs (`SET LOCAL idle_in_transaction_session_timeout`:
 * TransactionStart.oneTrip). A query fn starts after that (say, from a `.then` it did not return)
 * would run after the commit, so it is refused.
 *
 * If the query fails, BEGIN has already run, so the transaction exists, is marked failed, the
 * COMMIT after it is skipped by the server (everything up to Sync is), and the router's ROLLBACK
 * ends it exactly as before. If the COMMIT itself fails (a deferred constraint), the query's
 * promise rejects with that error, and nothing was committed.
 *
 * Without BEGIN. When that one query is also one statement that does the same in a block and out
 * of one (a SELECT, INSERT, UPDATE, DELETE, MERGE, WITH, VALUES or TABLE: blockNeutral), the
 * connection is the server's own session (src/pg/pooler.ts, serverSession: no pooler between), and
 * nothing but the search_path needs setting (the timeouts are the session's; no write LSN to read
 * after a COMMIT), the BEGIN, SET LOCAL and COMMIT give way to one session-level
 *
 *   Parse/Bind/Execute `SET search_path TO …`, the query's own messages, and one Sync
 *
 * which the server runs as one implicit transaction, committed at the Sync: the same one
 * transaction, two statements fewer for the server to run and for pg to read the answers of. If
 * the query fails, the SET is rolled back with it and nothing is left open (no ROLLBACK is sent);
 * if it succeeds, the connection keeps that search_path until its next call sets its own, as every
 * routed transaction does first. Nothing else uses the router's connections (a query fn starts
 * after its call ended is refused: DeferredBegin.callClient), and no other client shares this
 * one's session (a pooler would: there, and for anything else, the block stays).
 *
 * This works only for a query that uses the extended protocol anyway (one with parameters), and
 * for pg's own Query objects. Any other first query (text without parameters, which pg sends as a
 * simple Query and which may hold several statements; a named or row-limited query; a callback;
 * a cursor or stream) is preceded by `BEGIN; SET LOCAL …` sent the usual way, queued ahead of it,
 * and the COMMIT is a round trip of its own after fn. When fn never queries, nothing is sent, and
 * there is nothing to commit.
 */
/**
 * The node-postgres releases this file is tested with. FirstQuery below extends pg's Query and
 * uses members that are not pg's public API (`submit`, `_getRows`, `handleCommandComplete`,
 * `handleEmptyQuery`, `handleDataRow`, `handleReadyForQuery`, the connection's `execute`, `_send` and stream); a release
 * that changes them must not break routed calls. So at load they are checked: when one is missing, or pg's major is not the
 * tested one, every transaction starts the plain way (`BEGIN; SET LOCAL …` as a query of its own:
 * one more round trip per call, nothing else changes) and a warning says so, once.
 */
export const PG_TESTED_RANGE = '8.x (tested with 8.23)';

export type PipelineSupport = { readonly ok: true } | { readonly ok: false; readonly reason: string };

/** Whether pg's Query still has what FirstQuery relies on (and pg's major is the tested one). */
export function checkPgInternals(
  query: unknown = pg.Query,
  version: string | undefined = pgVersion(),
  connection: unknown = (pg as unknown as { Connection?: unknown }).Connection,
): PipelineSupport {
  if (version !== undefined && !/^8\./.test(version))
    return { ok: false, reason: `pg ${version} is outside the tested range ${PG_TESTED_RANGE}` };
  const proto = (query as { prototype?: Record<string, unknown> } | undefined)?.prototype;
  const missing = [
    'submit',
    '_getRows',
    'handleCommandComplete',
    'handleEmptyQuery',
    'handleDataRow',
    'handleReadyForQuery',
  ].filter((name) => typeof proto?.[name] !== 'function');
  if (missing.length > 0) return { ok: false, reason: `pg's Query has no ${missing.join(', ')}` };
  const connectionProto = (connection as { prototype?: Record<string, unknown> } | undefined)?.prototype;
  if (typeof connectionProto?._send !== 'function') return { ok: false, reason: "pg's Connection has no _send" };
  return { ok: true };
}

function pgVersion(): string | undefined {
  try {
    return (createRequire(import.meta.url)('pg/package.json') as { version?: string }).version;
  } catch {
    // Bundled without its package.json: the members are checked all the same.
    return undefined;
  }
}

let pipeline: PipelineSupport = checkPgInternals();
let warned = false;

/** For tests: force the plain path (false) or go back to what the check at load found (true). */
export function setBeginPipelining(enabled: boolean): void {
  pipeline = enabled ? checkPgInternals() : { ok: false, reason: 'disabled' };
}

/** Whether pg's internals the pipelined paths use are there (warns once when not). */
export function pipelining(): boolean {
  if (pipeline.ok) return true;
  if (!warned && pipeline.reason !== 'disabled') {
    warned = true;
    process.emitWarning(
      `shardctl: ${pipeline.reason}; routed transactions send BEGIN as a query of its own (one more round trip each)`,
      { code: 'SHARDCTL_PG_INTERNALS' },
    );
  }
  return false;
}

export class DeferredBegin {
  private sent = false;
  /** Queries fn started (through this client) so far. */
  private calls = 0;
  private failure: Error | undefined;
  private first: FirstQuery | undefined;
  private firstPromise: Promise<unknown> | undefined;
  private returnedValue: unknown = NOT_RETURNED;
  /** Declared by an adapter (commitWithOnlyQuery): fn's next query is all of its work. */
  only = false;

  constructor(
    private readonly client: pg.PoolClient,
    /** The statements that start the transaction. */
    private readonly start: TransactionStart,
    /** A COMMIT sent with fn's query is followed by WRITE_LSN_SQL, in the same write (writeLsn). */
    private readonly readsWriteLsn = false,
    /**
     * fn's named statements are sent unnamed: the connection may be another server's in the next
     * transaction (a transaction pooler), where the name would be missing or another client's.
     */
    private readonly unnamed = false,
    /**
     * The connection is the server's own session (no pooler between) and the call reads no write
     * LSN: a call that is one statement may run without a transaction block (start.implicit).
     */
    private readonly mayGoWithoutBlock = false,
  ) {
    // fn sees the pooled client through a view of its own (callClient): its query method hands
    // calls to this object, which refuses them once the call is over (end()).
    const query = (config: unknown, values?: unknown, callback?: unknown): unknown =>
      this.query(config, values, callback);
    this.callClient = new Proxy(client, {
      get: (target, property) => {
        if (property === 'query') return query;
        if (property === 'release' || property === 'end') return refuseRelease;
        if (property === HOOK) return this;
        const value = Reflect.get(target, property) as unknown;
        // Called on the client itself, so that what a method sets lands there (its class stays itself).
        return typeof value === 'function' && property !== 'constructor'
          ? (value as (...args: unknown[]) => unknown).bind(target)
          : value;
      },
    });
  }

  /**
   * The client fn is given: the pooled client, but its queries go through this transaction, and
   * one started after the call ended (from a `.then` fn did not return, a timer) is refused rather
   * than run outside the call: on the connection's next call, in another shard's transaction, or
   * between calls with the search_path the last call left (a call without a block sets it for the
   * session). The router's own statements (ROLLBACK, COMMIT) use the client itself.
   */
  readonly callClient: pg.PoolClient;

  private over = false;

  /** The call is over: fn's queries are refused from now on. */
  get ended(): boolean {
    return this.over;
  }

  /** Whether fn sent a named statement (with its name: not `unnamed`). */
  namedSent = false;

  /** Whether BEGIN was sent (fn made a query): only then is there a transaction to end. */
  get started(): boolean {
    return this.sent;
  }

  /**
   * Whether the server may still hold the call's transaction open (to be rolled back after a
   * failure): fn made a query, and neither a COMMIT sent with it ran nor did it run without a block.
   */
  get open(): boolean {
    return this.sent && this.first?.commitTag === undefined && this.first?.withoutBlock !== true;
  }

  /** The error of a BEGIN sent on its own, if it failed (fn's next query fails with it too). */
  get error(): Error | undefined {
    return this.failure;
  }

  /**
   * The tag of the COMMIT sent with fn's query ('COMMIT'), once its result arrived; undefined when
   * none was sent or it did not run. When set, the transaction is over.
   */
  get committed(): string | undefined {
    return this.first?.commitTag;
  }

  /** pg_current_wal_insert_lsn() read right after the COMMIT that went with fn's query, if asked. */
  get writeLsn(): string | undefined {
    return this.first?.writeLsn;
  }

  /** Whether fn's only query went without a transaction block (the protocol's Sync commits it). */
  get withoutBlock(): boolean {
    return this.first?.withoutBlock ?? false;
  }

  /** Whether a COMMIT went with fn's query (its outcome is known only once its answer came). */
  get commitSent(): boolean {
    return this.first?.commitSent ?? false;
  }

  /** What fn returned, recorded synchronously after calling it (decides the early COMMIT). */
  returned(value: unknown): void {
    this.returnedValue = value;
  }

  /** The call is over (fn's value or error is in): callClient refuses fn's queries from now on. */
  end(): void {
    this.over = true;
  }

  /** callClient's query: fn's queries, in this transaction. */
  query(config: unknown, values?: unknown, callback?: unknown): unknown {
    if (this.over)
      return refuse(
        new UsageError(
          "this query was started after its routed call ended (fn did not return or await it); it would run outside the call's transaction: in another call's, or in none. Nothing was sent",
          { input: "fn's query" },
        ),
        values,
        callback,
      );
    if (this.first?.commitSent)
      return refuse(
        new Error(
          'this query was started after the transaction committed: fn returned the promise of its only query, so the COMMIT went with it; return (or await) every query fn runs',
        ),
        values,
        callback,
      );
    const text = typeof config === 'string' ? config : (config as { text?: unknown } | null | undefined)?.text;
    const read = typeof text === 'string' ? readFnText(text) : undefined;
    const escape = read?.escape;
    if (escape)
      return refuse(
        new UsageError(
          `${escape}; the call is the shard's one transaction, and this would run what follows, or the connection's next user, outside it (use SET LOCAL, SAVEPOINT; nothing was sent)`,
          { input: "fn's query" },
        ),
        values,
        callback,
      );
    if (statementName(config) !== undefined) {
      if (this.unnamed) config = withoutName(config);
      else this.namedSent = true;
    }
    this.calls += 1;
    if (this.sent) return clientQuery.call(this.client, config, values, callback);
    this.sent = true;
    const query = pipelining() ? pipelinable(config, values, callback) : undefined;
    if (query) {
      this.firstPromise = new Promise((resolve, reject) => {
        // Alone: fn returned this query's promise and started no other query.
        const first = new FirstQuery(
          query.config,
          query.values,
          this.start,
          () => this.calls === 1 && (this.only || this.returnedValue === this.firstPromise),
          this.readsWriteLsn,
          this.mayGoWithoutBlock && this.start.implicit !== undefined && read?.blockNeutral === true,
        );
        first.callback = (error: Error | null, result: unknown) => (error ? reject(error) : resolve(result));
        this.first = first;
        clientQuery.call(this.client, first);
      });
      return this.firstPromise;
    }
    // The usual way: the statements as one simple query, queued ahead of fn's.
    (clientQuery.call(this.client, this.start.text) as Promise<unknown>).catch((error: Error) => {
      this.failure = error;
    });
    return clientQuery.call(this.client, config, values, callback);
  }
}

/**
 * fn's client.release() (or end(), which would close the pooled connection under the router): the
 * router ends the call's transaction and gives the connection back itself. Released by fn, the connection would go back to the pool with the call's transaction
 * still open, and the next call on that host would take it: its BEGIN and SET LOCAL search_path
 * would land in this call's transaction, so this call's later statements would run in that call's
 * shard, and the router's own release would then fail the call after its COMMIT.
 */
function refuseRelease(): never {
  throw new UsageError(
    "fn must not release or end the client: the router commits or rolls back the call's transaction and releases the connection when fn's promise settles",
    { input: "fn's client.release() or end()" },
  );
}

/** The name of a named statement (a query config's or pg Query's `name`), else undefined. */
function statementName(config: unknown): string | undefined {
  if (typeof config !== 'object' || config === null) return undefined;
  const name = (config as { name?: unknown }).name;
  return typeof name === 'string' && name !== '' ? name : undefined;
}

/**
 * The same query, unnamed: a config is copied without its name; a pg Query (or other submittable,
 * made for this one call) loses its name itself.
 */
function withoutName(config: unknown): unknown {
  const named = config as { name?: unknown; submit?: unknown };
  if (typeof named.submit === 'function') {
    named.name = undefined;
    return named;
  }
  const { name: _name, ...rest } = named;
  return rest;
}

/** An error for a query fn started, as pg would deliver it: to its callback, else as a rejected promise. */
function refuse(error: Error, values: unknown, callback: unknown): unknown {
  if (typeof values === 'function') return void (values as (e: Error) => void)(error);
  if (typeof callback === 'function') return void (callback as (e: Error) => void)(error);
  return Promise.reject(error);
}

/**
 * What a text fn sends is, read once per text (an application sends the same few texts again and
 * again): why it would end the call's transaction or change the session beyond it (firstEscape:
 * COMMIT, SET without LOCAL, LISTEN, PREPARE, …), and whether it is one statement that does the same
 * in a block and out of one (blockNeutral). Bounded: past FN_TEXTS_KEPT texts the memory starts
 * again, and a text longer than FN_TEXT_KEPT_CHARS is read each time.
 */
function readFnText(text: string): FnText {
  let read = fnTexts.get(text);
  if (read === undefined) {
    const escape = firstEscape(text);
    read = { ...(escape !== undefined ? { escape } : {}), blockNeutral: escape === undefined && blockNeutral(text) };
    if (text.length <= FN_TEXT_KEPT_CHARS) {
      if (fnTexts.size >= FN_TEXTS_KEPT) fnTexts.clear();
      fnTexts.set(text, read);
    }
  }
  return read;
}

interface FnText {
  readonly escape?: string;
  /** One statement that does the same in a transaction block and out of one (blockNeutral). */
  readonly blockNeutral: boolean;
}

const fnTexts = new Map<string, FnText>();
const FN_TEXTS_KEPT = 1024;
const FN_TEXT_KEPT_CHARS = 8192;

/**
 * For a query builder's adapter (src/adapters/): the query fn is about to start on `client` is all
 * of fn's work, so its COMMIT may go in the same write, although fn returns the builder's own
 * promise (which maps the rows) rather than the query's. A query started after it is refused, as
 * for a returned query promise. Does nothing on a client no routed transaction holds.
 */
export function commitWithOnlyQuery(client: pg.ClientBase): void {
  const hook = (client as unknown as { [HOOK]?: DeferredBegin })[HOOK];
  if (hook && !hook.started && !hook.ended) hook.only = true;
}

const NOT_RETURNED = Symbol('not returned');
/** What a call's client (DeferredBegin.callClient) answers with its DeferredBegin. */
const HOOK = Symbol('shardctl.deferredBegin');
// eslint-disable-next-line @typescript-eslint/unbound-method -- always called as clientQuery.call(client, ...)
const clientQuery = pg.Client.prototype.query as unknown as (this: unknown, ...args: unknown[]) => unknown;

/** Config and values of a first query that can carry the BEGIN, else undefined. */
function pipelinable(
  config: unknown,
  values: unknown,
  callback: unknown,
): { config: string | pg.QueryConfig; values?: unknown[] } | undefined {
  if (typeof values === 'function' || callback !== undefined) return undefined;
  if (typeof config === 'string') return Array.isArray(values) && values.length > 0 ? { config, values } : undefined;
  if (typeof config !== 'object' || config === null) return undefined;
  const c = config as pg.QueryConfig & { submit?: unknown; callback?: unknown; rows?: unknown; queryMode?: string };
  if (typeof c.submit === 'function' || c.callback !== undefined || c.name || c.rows || typeof c.text !== 'string')
    return undefined;
  if (values !== undefined && !Array.isArray(values)) return undefined;
  if (c.values !== undefined && !Array.isArray(c.values)) return undefined;
  const own = values ?? c.values;
  const extended = c.queryMode === 'extended' || (Array.isArray(own) && own.length > 0);
  return extended ? { config: c, ...(values !== undefined ? { values: values as unknown[] } : {}) } : undefined;
}

/** The parts of pg's Connection used here (the same calls pg's Query and pg-cursor make). */
interface WireConnection {
  stream: { writable: boolean; write(data: Buffer): boolean };
  execute(config: { portal?: string; rows?: number }): void;
}

/** As pg's Connection sends a message. */
function send(connection: WireConnection, bytes: Buffer): void {
  if (connection.stream.writable) connection.stream.write(bytes);
}

/** A statement that starts a transaction; `openOnly`: needed only by a transaction left open between round trips. */
export interface StartStatement {
  readonly sql: string;
  /**
   * Left out when the transaction is one round trip (its COMMIT goes in the same write): e.g.
   * `SET LOCAL idle_in_transaction_session_timeout`, whose timer the server arms only when it
   * waits for the client inside a transaction, which such a transaction never does.
   */
  readonly openOnly?: boolean;
}

/**
 * The statements that start a shard's transaction (e.g. `BEGIN` and `SET LOCAL search_path TO
 * "insta5"`), as one simple-query text and as the Parse/Bind/Execute messages of each; `oneTrip`,
 * the same without the statements only an open transaction needs. Built once per shard by the
 * router, not on every call.
 */
export class TransactionStart {
  readonly text: string;
  readonly messages: Buffer;
  readonly statements: number;
  readonly oneTrip: { readonly messages: Buffer; readonly statements: number };
  /**
   * The start of a one-statement call without a transaction block (`SET search_path TO …` at
   * session level: see "Without BEGIN" above), where that can stand in for this start; else undefined.
   */
  readonly implicit: { readonly messages: Buffer; readonly statements: number } | undefined;

  constructor(statements: readonly (string | StartStatement)[], implicit?: readonly string[]) {
    this.implicit = implicit
      ? { messages: Buffer.concat(implicit.map(statementMessages)), statements: implicit.length }
      : undefined;
    const all = statements.map((s) => (typeof s === 'string' ? { sql: s } : s));
    this.text = all.map((s) => s.sql).join('; ');
    const messages = all.map((s) => statementMessages(s.sql));
    this.messages = Buffer.concat(messages);
    this.statements = all.length;
    const kept = messages.filter((_, i) => all[i]?.openOnly !== true);
    this.oneTrip =
      kept.length === messages.length
        ? { messages: this.messages, statements: this.statements }
        : { messages: Buffer.concat(kept), statements: kept.length };
  }
}

/**
 * Whether the results of several shards' transactions sent as one text or one pipeline have the
 * expected shape: per shard BEGIN, `framing - 1` SETs, `statements` results, COMMIT, and nothing else.
 */
export function framedPerShard(
  results: readonly { readonly command: string; readonly rowCount?: number | null }[],
  shards: number,
  framing: number,
  statements: number,
): boolean {
  const group = framing + statements + 1;
  return (
    results.length === shards * group &&
    Array.from({ length: shards }).every(
      (_, i) =>
        results[i * group]?.command === 'BEGIN' &&
        // SET LOCALs, and the SELECT that checks a standby (src/router/replicas.ts, no row when it passes).
        results
          .slice(i * group + 1, i * group + framing)
          .every((r) => r.command === 'SET' || (r.command === 'SELECT' && r.rowCount === 0)) &&
        results[i * group + group - 1]?.command === 'COMMIT',
    )
  );
}

/** Sync, and COMMIT followed by Sync: the end of the first query's messages. */
const SYNC = Buffer.from([0x53, 0, 0, 0, 4]);
const COMMIT_SYNC = Buffer.concat([statementMessages('COMMIT'), SYNC]);

/**
 * Where the WAL ends right after a COMMIT, read in the same round trip: at or past the end of the
 * commit record, so a standby that has replayed up to it sees the transaction (router.lastWriteLsn).
 */
export const WRITE_LSN_SQL = 'SELECT pg_catalog.pg_current_wal_insert_lsn()::text AS lsn';
const COMMIT_LSN_SYNC = Buffer.concat([statementMessages('COMMIT'), statementMessages(WRITE_LSN_SQL), SYNC]);

/**
 * Parse, Bind and Execute of one statement without parameters or results to describe, on the
 * unnamed statement and portal (protocol 3.0, byte for byte as pg writes them).
 */
export function statementMessages(text: string): Buffer {
  const query = Buffer.from(`${text}\0`, 'utf8');
  const bytes = Buffer.alloc(1 + 4 + 1 + query.length + 2 + (1 + 4 + 1 + 1 + 2 + 2 + 2 + 2) + (1 + 4 + 1 + 4));
  let at = 0;
  // Parse: name "", the text, no parameter types.
  at = bytes.writeUInt8(0x50, at);
  at = bytes.writeInt32BE(4 + 1 + query.length + 2, at);
  at += 1;
  at += query.copy(bytes, at);
  at = bytes.writeInt16BE(0, at);
  // Bind: portal "", statement "", no parameter formats, no parameters, one result format: text.
  at = bytes.writeUInt8(0x42, at);
  at = bytes.writeInt32BE(4 + 1 + 1 + 2 + 2 + 2 + 2, at);
  at += 2 + 4;
  at = bytes.writeInt16BE(1, at);
  at += 2;
  // Execute: portal "", no row limit.
  at = bytes.writeUInt8(0x45, at);
  bytes.writeInt32BE(4 + 1 + 4, at);
  return bytes;
}

interface QueryInternals {
  portal: string;
  submit(connection: WireConnection): Error | null | void;
  handleCommandComplete(message: { text: string }, connection: WireConnection): void;
  handleEmptyQuery(connection: WireConnection): void;
  callback?: (error: Error | null, result: unknown) => void;
}

const BaseQuery = pg.Query as unknown as new (config: string | pg.QueryConfig, values?: unknown[]) => QueryInternals;

/** fn's first query: the statements that start the transaction ahead of it, maybe COMMIT after it. */
class FirstQuery extends BaseQuery {
  /** Results of the start's statements still to come (not fn's), set when the messages are written. */
  private skip = 0;
  private mainDone = false;
  private executed = false;
  /** A COMMIT was written after the query. */
  commitSent = false;
  /** Its tag, once it ran. */
  commitTag: string | undefined;
  /** WRITE_LSN_SQL's answer, when it was sent after the COMMIT. */
  writeLsn: string | undefined;
  /** Sent without a transaction block (start.implicit, and Sync commits it). */
  withoutBlock = false;

  constructor(
    config: string | pg.QueryConfig,
    values: unknown[] | undefined,
    private readonly start: TransactionStart,
    /** At the end of the tick: is this query all of fn's work? */
    private readonly alone: () => boolean,
    private readonly readsWriteLsn = false,
    /** Alone, it may go without a transaction block (start.implicit is there, and the text allows it). */
    private readonly mayGoWithoutBlock = false,
  ) {
    super(config, values);
  }

  override submit(connection: WireConnection): Error | null | void {
    // pg's own Query writes Parse/Bind/Describe/Execute (and, through _getRows below, not Sync) to
    // the connection's stream: here into `captured`, the stream being swapped for the call. All of
    // it goes out at the end of the tick, when fn has returned: only then is it known whether the
    // COMMIT goes with the query, and so whether the start's open-only statements
    // (TransactionStart.oneTrip) are needed. pg's Query could refuse its config before writing (no
    // text, values not an array, a name reused): pipelinable() lets none of those here. If binding
    // a value throws, it writes Close and Sync itself (captured too) and fails the query; then
    // nothing is added below but the start ahead of them.
    const stream = connection.stream;
    const captured: Buffer[] = [];
    connection.stream = {
      writable: true,
      write: (bytes: Buffer) => captured.push(bytes) > 0,
    };
    let error: Error | null | void;
    try {
      error = super.submit(connection);
    } finally {
      connection.stream = stream;
    }
    queueMicrotask(() => {
      const alone = this.executed && this.alone();
      const bare = alone && this.mayGoWithoutBlock ? this.start.implicit : undefined;
      const start = bare ?? (alone ? this.start.oneTrip : this.start);
      this.skip = start.statements;
      // One buffer, one write: a few hundred bytes copied cost less than a write call per message.
      captured.unshift(start.messages);
      if (this.executed) captured.push(alone && !bare ? (this.readsWriteLsn ? COMMIT_LSN_SYNC : COMMIT_SYNC) : SYNC);
      send(connection, Buffer.concat(captured));
      this.commitSent = alone;
      this.withoutBlock = bare !== undefined;
    });
    return error;
  }

  /** pg's Query ends its messages here with Sync; the Sync is written at the end of the tick instead. */
  _getRows(connection: WireConnection, rows?: number): void {
    connection.execute({ portal: this.portal, ...(rows ? { rows } : {}) });
    this.executed = true;
  }

  override handleCommandComplete(message: { text: string }, connection: WireConnection): void {
    if (this.skip > 0) {
      // BEGIN's and SET's: not fn's result.
      this.skip -= 1;
    } else if (!this.mainDone) {
      this.mainDone = true;
      super.handleCommandComplete(message, connection);
    } else {
      // The COMMIT written after it (then WRITE_LSN_SQL's SELECT, whose row handleDataRow kept).
      this.commitTag ??= message.text;
    }
  }

  /** WRITE_LSN_SQL's row after the COMMIT is not fn's: kept apart. */
  handleDataRow(message: { fields: unknown[] }): void {
    if (this.mainDone) {
      const field = message.fields[0];
      this.writeLsn = typeof field === 'string' ? field : Buffer.isBuffer(field) ? field.toString('utf8') : undefined;
      return;
    }
    (BaseQuery.prototype as unknown as { handleDataRow(m: unknown): void }).handleDataRow.call(this, message);
  }

  override handleEmptyQuery(connection: WireConnection): void {
    this.mainDone = true;
    super.handleEmptyQuery(connection);
  }

  /**
   * Without a block, the Sync committed the statement: ReadyForQuery reaches the query only when no
   * error came before it (pg hands an ErrorResponse to the query and lets it go).
   */
  handleReadyForQuery(connection: WireConnection): void {
    if (this.withoutBlock && this.mainDone) this.commitTag ??= 'COMMIT';
    (BaseQuery.prototype as unknown as { handleReadyForQuery(c: unknown): void }).handleReadyForQuery.call(
      this,
      connection,
    );
  }
}
