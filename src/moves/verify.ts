import type pg from 'pg';
import { shardLeaves, type KeyedTable, type LeafTable, type ShardTable, type TypedShardTable } from './catalog.js';
import { type TableName } from './sql/names.js';
import { EXPORT_SNAPSHOT_SQL, setTransactionSnapshotSql } from './sql/session.js';
import { DELETE_LOG_SQL, TAIL_MAX_KEYS } from './sql/tail.js';
import { checksumsSql, BUILT_IN_TYPE_NAME, hashProbeSql, STABLE_TEXT_SETTINGS, type HashMethod } from './sql/verify.js';
import { fromLog, readLogSums, type LogSums, type TableChanges } from './tail.js';
import { endQuietly, inTransaction } from '../pg/quiet.js';

/**
 * The comparison of both copies of a shard: row counts and content checksums of every table,
 * computed on both hosts at once (the tables themselves are read in catalog.ts).
 */

export type { HashMethod };

/**
 * The checksum method of each table: the record hash where it is OID-free, every column type has
 * an extended hash function and no column a nondeterministic collation, else text (a row's text
 * tells 'Abc' from 'abc' whatever the collation). Probed once per column type, not per table, on
 * both hosts (each hashes its own copy, and they may be of different majors): all the types in one
 * round trip each, and one by one only when that fails (a type without one).
 */
export async function hashMethods(
  hosts: readonly pg.Client[],
  tables: readonly TypedShardTable[],
  recordHash: boolean,
): Promise<Map<string, HashMethod>> {
  const candidates = recordHash ? tables.filter((t) => t.portable && !t.nondeterministic) : [];
  // Only the names format_type gives built-in types are probed; anything else is hashed as text.
  const types = [...new Set(candidates.flatMap((t) => t.columnTypes))].filter((type) => BUILT_IN_TYPE_NAME.test(type));
  const probeOn = async (client: pg.Client, some: readonly string[]): Promise<boolean> => {
    try {
      await client.query(hashProbeSql(some));
      return true;
    } catch (error) {
      // 42883: no extended hash function; 42704: a type this host's major lacks.
      if (!['42883', '42704'].includes((error as { code?: string }).code ?? '')) throw error;
      return false;
    }
  };
  const probe = async (some: readonly string[]): Promise<boolean> =>
    (await Promise.all(hosts.map((client) => probeOn(client, some)))).every(Boolean);
  const hashable = new Set<string>();
  if (types.length > 0 && (await probe(types))) for (const type of types) hashable.add(type);
  else if (types.length > 1) for (const type of types) if (await probe([type])) hashable.add(type);
  const record = new Set(candidates.filter((t) => t.columnTypes.every((type) => hashable.has(type))));
  return new Map(tables.map((t) => [`${t.schema}.${t.table}`, record.has(t) ? 'record' : 'text']));
}

export interface TableChecksum {
  readonly rows: bigint;
  /** Sum of a 64-bit hash of every row: order-independent, compared exactly. */
  readonly checksum: string;
}

/** One table's count and checksum: every row, or only the rows whose key is in a JSON array of keys. */
interface ChecksumQuery {
  readonly table: TableName;
  readonly keys?: { readonly keyed: KeyedTable; readonly json: string };
}

/** Counts and checksums of many tables (or key subsets of them) in one round trip. */
async function checksums(
  client: pg.Client,
  queries: readonly ChecksumQuery[],
  methods: ReadonlyMap<string, HashMethod>,
): Promise<TableChecksum[]> {
  if (queries.length === 0) return [];
  const { sql, params } = checksumsSql(
    queries.map(({ table, keys }) => ({
      table,
      method: methods.get(`${table.schema}.${table.table}`) ?? 'text',
      ...(keys ? { keys } : {}),
    })),
  );
  const result = await client.query<{ i: number; rows: string; checksum: string }>(sql, params);
  return result.rows.map((r) => ({ rows: BigInt(r.rows), checksum: r.checksum }));
}

/**
 * The first part of a wave's verification, before its fence (see src/moves/tail.ts): on one fresh
 * connection per host (the holder), a REPEATABLE READ transaction that exports its snapshot P and
 * is left open, touching no table; the count and checksum of every keyed and every logged table as
 * of P, and the logs' sums as of P, computed on the `work` sessions in transactions that import P
 * and commit. Tracking (on the target) and the logs (of `logged.tables` on both hosts, and of the
 * keyed tables on the source when `logged.keyedOnSource`) must already run.
 *
 * The holders take no lock on any table until the wave's verification looks up its changed keys
 * (after the catch-up, within the fence limit): a session of the move that held a table lock while
 * the move waits for the catch-up would block the apply worker's replicated TRUNCATE on the
 * target, or an application's TRUNCATE queued on the source and the unfence behind it, and the
 * move would wait for itself.
 */
export interface PreVerification {
  /** The holders: each in its transaction with snapshot P. */
  readonly source: pg.Client;
  readonly target: pg.Client;
  readonly moveId: string;
  readonly keyed: ReadonlyMap<string, KeyedTable>;
  /** The tables verified from their change logs on both hosts (tail.ts), by `schema.table`. */
  readonly logged: ReadonlySet<string>;
  /**
   * Whether the source's figure of each keyed table comes from its change log (the target's from
   * its changed keys): then a change the source committed after P that never reached the target
   * leaves the two apart, although no key of it was recorded.
   */
  readonly keyedOnSource: boolean;
  readonly at: ReadonlyMap<string, { readonly source: TableChecksum; readonly target: TableChecksum }>;
  /** The logs' sums as of P on each host. */
  readonly logAt: { readonly source: ReadonlyMap<string, LogSums>; readonly target: ReadonlyMap<string, LogSums> };
}

/** A table's figures from the copy (copy-logs.ts): its chunks' sums on both hosts, and the source's log as of the copy's snapshot. */
export interface CopyFigure {
  readonly source: TableChecksum;
  readonly target: TableChecksum;
  readonly sourceLogAtS: LogSums | undefined;
}

export async function preVerify(
  holders: { readonly source: pg.Client; readonly target: pg.Client },
  work: { readonly source: pg.Client; readonly target: pg.Client },
  keyed: readonly KeyedTable[],
  methods: ReadonlyMap<string, HashMethod>,
  logged: {
    readonly moveId: string;
    readonly tables: readonly ShardTable[];
    readonly keyedOnSource?: boolean;
    /** Keyed tables (`schema.table`) whose figures at P come from the copy and the logs since (copy-logs.ts), not read. */
    readonly fromCopy?: ReadonlyMap<string, CopyFigure>;
  },
): Promise<PreVerification> {
  const keyedOnSource = (logged.keyedOnSource ?? false) && keyed.length > 0;
  const fromCopy = keyedOnSource ? (logged.fromCopy ?? new Map<string, CopyFigure>()) : new Map<string, CopyFigure>();
  const exportSnapshot = async (holder: pg.Client): Promise<string> => {
    await holder.query(STABLE_TEXT_SETTINGS);
    await holder.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
    return (await holder.query<{ snapshot: string }>(EXPORT_SNAPSHOT_SQL)).rows[0]!.snapshot;
  };
  const [sourceSnapshot, targetSnapshot] = await Promise.all([
    exportSnapshot(holders.source),
    exportSnapshot(holders.target),
  ]);
  const tables = [...keyed.map((k) => k.table), ...logged.tables];
  const queries = tables.filter((table) => !fromCopy.has(tableKey(table))).map((table) => ({ table }));
  const atSnapshot = async (
    client: pg.Client,
    snapshot: string,
    hasLogs: boolean,
  ): Promise<{ sums: TableChecksum[]; logs: Map<string, LogSums>; logsAtP: Map<string, LogSums> }> => {
    await client.query(STABLE_TEXT_SETTINGS);
    // In one turn of the session (a clean-up queued on it when the other host's reads failed waits
    // for this transaction's end, not runs inside it), the snapshot's import included: an import
    // that fails (its holder gone) leaves no aborted transaction behind.
    const begin = `BEGIN ISOLATION LEVEL REPEATABLE READ; ${setTransactionSnapshotSql(snapshot)}`;
    return inTransaction(client, begin, async () => {
      const sums = await checksums(client, queries, methods);
      const logs = hasLogs ? await readLogSums(client, logged.moveId) : new Map<string, LogSums>();
      // The logs have run since the copy (fromCopy): the entries P sees are many, and only the
      // changes since P are needed while fenced. Deleted in P's own transaction, which sees exactly
      // those (entries are only ever inserted): the log then holds the changes after P alone, and
      // its sums at P are zero.
      if (hasLogs && fromCopy.size > 0) {
        await client.query(DELETE_LOG_SQL, [logged.moveId]);
        return { sums, logs, logsAtP: new Map<string, LogSums>() };
      }
      return { sums, logs, logsAtP: logs };
    });
  };
  const [src, dst] = await Promise.all([
    atSnapshot(work.source, sourceSnapshot, logged.tables.length > 0 || keyedOnSource),
    atSnapshot(work.target, targetSnapshot, logged.tables.length > 0 || fromCopy.size > 0),
  ]);
  // Each table's figures at P: read now, or carried from the copy by the changes logged since.
  const read = new Map(queries.map((q, i) => [tableKey(q.table), { source: src.sums[i]!, target: dst.sums[i]! }]));
  const figureAt = (t: TableName): { source: TableChecksum; target: TableChecksum } => {
    const copied = fromCopy.get(tableKey(t));
    if (!copied) return read.get(tableKey(t))!;
    const carried = (from: TableChecksum, logAtS: LogSums | undefined, logAtP: LogSums | undefined): TableChecksum => {
      const { rows, checksum } = fromLog(from, logAtS, logAtP);
      return { rows, checksum };
    };
    return {
      source: carried(copied.source, copied.sourceLogAtS, src.logs.get(tableKey(t))),
      target: carried(copied.target, undefined, dst.logs.get(tableKey(t))),
    };
  };
  return {
    source: holders.source,
    target: holders.target,
    moveId: logged.moveId,
    keyed: new Map(keyed.map((k) => [tableKey(k.table), k])),
    logged: new Set(logged.tables.map(tableKey)),
    keyedOnSource,
    at: new Map(tables.map((t) => [tableKey(t), figureAt(t)])),
    logAt: { source: src.logsAtP, target: dst.logsAtP },
  };
}

/** Ends a pre-verification's transactions and connections. */
export async function endPreVerification(pre: PreVerification): Promise<void> {
  // The pre-verification only read: ending it loses nothing, and a connection that broke is closed already.
  await Promise.all(
    [pre.source, pre.target].map((c) =>
      c
        .query('COMMIT')
        .catch(() => undefined)
        .then(() => endQuietly(c)),
    ),
  );
}

function tableKey(t: TableName): string {
  return `${t.schema}.${t.table}`;
}

function plus(a: TableChecksum, minus: TableChecksum, add: TableChecksum): TableChecksum {
  return {
    rows: a.rows - minus.rows + add.rows,
    checksum: (BigInt(a.checksum) - BigInt(minus.checksum) + BigInt(add.checksum)).toString(),
  };
}

/**
 * How one host's figure of one table is had while fenced: none (empty on both hosts), its checksum
 * over all rows now (`whole`, an index into its Queries' `now`), from P and its change log (`log`),
 * its figure at P unchanged (`at`: no key of it changed), or from P minus and plus the rows of its
 * changed keys (`lookup`: the index of those rows now, and `atP` of the same rows at P).
 */
type Figure =
  | { readonly zero: true }
  | { readonly whole: number }
  | { readonly log: TableChecksum }
  | { readonly at: TableChecksum }
  | { readonly lookup: number; readonly atP: number; readonly from: TableChecksum };

const ZERO: Figure = { zero: true };

/** One host's checksum queries while fenced: those over its tables now, and those in P's transaction. */
class Queries {
  readonly now: ChecksumQuery[] = [];
  readonly atP: ChecksumQuery[] = [];

  whole(table: TableName): Figure {
    return { whole: this.now.push({ table }) - 1 };
  }

  lookup(table: TableName, keys: { readonly keyed: KeyedTable; readonly json: string }, from: TableChecksum): Figure {
    return {
      lookup: this.now.push({ table, keys }) - 1,
      atP: this.atP.push({ table, keys }) - 1,
      from,
    };
  }
}

/**
 * One host's figures while fenced: its Queries run (now on `client`, at P on `holder`, at once) and
 * its log's sums read when `moveId` is given; `figure` then gives a table's count and checksum, and
 * the log entries since P it took.
 */
async function figuresOf(
  client: pg.Client,
  queries: Queries,
  methods: ReadonlyMap<string, HashMethod>,
  moveId: string | undefined,
  holder: pg.Client | undefined,
): Promise<{
  figure: (f: Figure, logAtP: LogSums | undefined, table: string) => TableChecksum & { changes: bigint };
}> {
  if (queries.now.length > 0) await client.query(STABLE_TEXT_SETTINGS);
  const [now, atP, log] = await Promise.all([
    checksums(client, queries.now, methods),
    checksums(holder ?? client, queries.atP, methods),
    moveId === undefined ? new Map<string, LogSums>() : readLogSums(client, moveId),
  ]);
  return {
    figure: (f, logAtP, table) => {
      if ('zero' in f) return { rows: 0n, checksum: '0', changes: 0n };
      if ('whole' in f) return { ...now[f.whole]!, changes: 0n };
      if ('log' in f) return fromLog(f.log, logAtP, log.get(table));
      if ('at' in f) return { ...f.at, changes: 0n };
      return { ...plus(f.from, atP[f.atP]!, now[f.lookup]!), changes: 0n };
    },
  };
}

export interface TableVerification {
  readonly schema: string;
  readonly table: string;
  readonly sourceRows: string;
  readonly targetRows: string;
  readonly match: boolean;
}

export interface VerifyResult {
  readonly ok: boolean;
  /** Rows verified (on the source), over every table compared. */
  readonly rows: bigint;
  readonly tables: readonly TableVerification[];
  readonly mismatches: readonly string[];
  /**
   * Tables verified while fenced by their changed rows only (pre-verified before the fence), and the
   * keys looked up for them.
   */
  readonly byKey: { readonly tables: number; readonly keys: number };
  /** Tables verified while fenced from their change logs (pre-verified before the fence), and the log entries written since P on both hosts. */
  readonly byLog: { readonly tables: number; readonly changes: number };
  /**
   * Tables (`schema.table`) checksummed over all their rows while fenced: the cost that grows with
   * the data. `truncated` are keyed tables truncated during the cut-over, also checksummed whole,
   * but they hold only the rows written since.
   */
  readonly whole: readonly string[];
  readonly truncated: readonly string[];
  /**
   * Tables left untracked because they were empty when the cut-over began (emptyBefore), found not
   * empty while fenced and checksummed whole: they hold only the rows written during the cut-over.
   */
  readonly filled: readonly string[];
  /** Tables without a page on either host while fenced: no row to compare, none read. */
  readonly empty: number;
}

/**
 * Row counts and content checksums of every table of `schemas`, on both hosts at once (the same
 * schema names on both). `methods` comes from hashMethods(), computed before the fence. A table
 * without a page on either host holds no row on either: it matches without being read.
 * `emptyBefore` names the tables the cut-over left untracked because they were empty then;
 * `leaves`, each host's tables as they are now, when the caller has them (else they are read).
 */
export async function verifyShards(
  source: pg.Client,
  target: pg.Client,
  schemas: readonly string[],
  methods: ReadonlyMap<string, HashMethod>,
  tail?: { readonly pre: PreVerification; readonly changes: ReadonlyMap<string, TableChanges> },
  {
    emptyBefore = new Set<string>(),
    leaves,
  }: {
    readonly emptyBefore?: ReadonlySet<string> | undefined;
    readonly leaves?: { readonly source: readonly LeafTable[]; readonly target: readonly LeafTable[] } | undefined;
  } = {},
): Promise<VerifyResult> {
  const [tables, targetTables] = leaves
    ? [leaves.source, leaves.target]
    : await Promise.all([shardLeaves(source, schemas), shardLeaves(target, schemas)]);
  const key = tableKey;
  const onTarget = new Map(targetTables.map((t) => [key(t), t]));
  const onSource = new Set(tables.map(key));
  const mismatches: string[] = [];
  for (const t of tables) if (!onTarget.has(key(t))) mismatches.push(`table ${key(t)} is missing on the target`);
  for (const t of targetTables) if (!onSource.has(key(t))) mismatches.push(`table ${key(t)} exists only on the target`);
  const common = tables.filter((t) => onTarget.has(key(t)));

  // Per table and host: checksummed whole now, or (pre-verified) from P and its log, or from P
  // minus and plus its changed keys. Each host's figure is its own: the source's of a keyed table
  // comes from its log when it has one (keyedOnSource), the target's from the keys recorded there.
  const queries = { source: new Queries(), target: new Queries() };
  const wholeNames: string[] = [];
  const truncatedNames: string[] = [];
  const filledNames: string[] = [];
  let emptyTables = 0;
  let byKeyTables = 0;
  let byKeyKeys = 0;
  let byLogTables = 0;
  const plan = common.map((t): { source: Figure; target: Figure } => {
    if (t.empty && onTarget.get(key(t))!.empty) {
      emptyTables += 1;
      return { source: ZERO, target: ZERO };
    }
    const keyed = tail?.pre.keyed.get(key(t));
    const at = tail?.pre.at.get(key(t));
    const changes = tail?.changes.get(key(t));
    if (at && tail?.pre.logged.has(key(t))) {
      byLogTables += 1;
      return { source: { log: at.source }, target: { log: at.target } };
    }
    const whole = (): { source: Figure; target: Figure } => ({
      source: queries.source.whole(t),
      target: queries.target.whole(t),
    });
    if (!keyed || !at) {
      (emptyBefore.has(key(t)) ? filledNames : wholeNames).push(key(t));
      return whole();
    }
    const fromSourceLog = tail!.pre.keyedOnSource;
    if (changes?.truncated || (changes && changes.keys > TAIL_MAX_KEYS)) {
      (changes.truncated ? truncatedNames : wholeNames).push(key(t));
      return fromSourceLog ? { source: { log: at.source }, target: queries.target.whole(t) } : whole();
    }
    byKeyTables += 1;
    const byKeys = (side: 'source' | 'target'): Figure => {
      if (!changes || changes.keys === 0) return { at: at[side] };
      return queries[side].lookup(t, { keyed, json: changes.keysJson }, at[side]);
    };
    if (changes) byKeyKeys += changes.keys;
    return { source: fromSourceLog ? { log: at.source } : byKeys('source'), target: byKeys('target') };
  });
  const hasLog = (side: 'source' | 'target'): boolean => plan.some((p) => 'log' in p[side]);
  const [src, dst] = await Promise.all([
    figuresOf(source, queries.source, methods, hasLog('source') ? tail?.pre.moveId : undefined, tail?.pre.source),
    figuresOf(target, queries.target, methods, hasLog('target') ? tail?.pre.moveId : undefined, tail?.pre.target),
  ]);
  let byLogChanges = 0n;
  const report = common.map((t, i) => {
    const p = plan[i]!;
    const k = key(t);
    const s = src.figure(p.source, tail?.pre.logAt.source.get(k), k);
    const d = dst.figure(p.target, tail?.pre.logAt.target.get(k), k);
    if (tail?.pre.logged.has(k)) byLogChanges += s.changes + d.changes;
    const match = s.rows === d.rows && s.checksum === d.checksum;
    if (!match) {
      const name = t.parent === undefined ? `table ${k}` : `table ${k} (a partition of ${t.schema}.${t.parent})`;
      mismatches.push(
        s.rows === d.rows
          ? `${name}: ${s.rows} rows on both, but their contents differ (checksum)`
          : `${name}: ${s.rows} rows on the source, ${d.rows} on the target`,
      );
    }
    return {
      row: { schema: t.schema, table: t.table, sourceRows: s.rows.toString(), targetRows: d.rows.toString(), match },
      rows: s.rows,
    };
  });
  return {
    ok: mismatches.length === 0,
    rows: report.reduce((n, r) => n + r.rows, 0n),
    tables: report.map((r) => r.row),
    mismatches,
    byKey: { tables: byKeyTables, keys: byKeyKeys },
    byLog: { tables: byLogTables, changes: Number(byLogChanges) },
    whole: wholeNames,
    truncated: truncatedNames,
    filled: filledNames,
    empty: emptyTables,
  };
}
