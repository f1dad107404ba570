import type pg from 'pg';
import { shardLeaves, type KeyedTable, type LeafTable, type ShardTable, type TypedShardTable } from './catalog.js';
import {
  TAIL_MAX_KEYS,
  checksumsSql,
  EXPORT_SNAPSHOT_SQL,
  BUILT_IN_TYPE_NAME,
  hashProbeSql,
  setTransactionSnapshotSql,
  STABLE_TEXT_SETTINGS,
  type HashMethod,
  type TableName,
} from './sql.js';
import { fromLog, readLogSums, type LogSums, type TableChanges } from './tail.js';
import { endQuietly, rollbackQuietly } from '../pg/quiet.js';

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

interface TableChecksum {
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
 * and commit. Tracking (on the target) and the logs (on both hosts) must already run.
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
  /** The tables verified from their change logs (tail.ts), by `schema.table`. */
  readonly logged: ReadonlySet<string>;
  readonly at: ReadonlyMap<string, { readonly source: TableChecksum; readonly target: TableChecksum }>;
  /** The logs' sums as of P on each host. */
  readonly logAt: { readonly source: ReadonlyMap<string, LogSums>; readonly target: ReadonlyMap<string, LogSums> };
}

export async function preVerify(
  holders: { readonly source: pg.Client; readonly target: pg.Client },
  work: { readonly source: pg.Client; readonly target: pg.Client },
  keyed: readonly KeyedTable[],
  methods: ReadonlyMap<string, HashMethod>,
  logged: { readonly moveId: string; readonly tables: readonly ShardTable[] },
): Promise<PreVerification> {
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
  const queries = tables.map((table) => ({ table }));
  const atSnapshot = async (
    client: pg.Client,
    snapshot: string,
  ): Promise<{ sums: TableChecksum[]; logs: Map<string, LogSums> }> => {
    await client.query(STABLE_TEXT_SETTINGS);
    await client.query(`BEGIN ISOLATION LEVEL REPEATABLE READ; ${setTransactionSnapshotSql(snapshot)}`);
    try {
      const sums = await checksums(client, queries, methods);
      const logs = logged.tables.length > 0 ? await readLogSums(client, logged.moveId) : new Map<string, LogSums>();
      await client.query('COMMIT');
      return { sums, logs };
    } catch (error) {
      await rollbackQuietly(client);
      throw error;
    }
  };
  const [src, dst] = await Promise.all([
    atSnapshot(work.source, sourceSnapshot),
    atSnapshot(work.target, targetSnapshot),
  ]);
  return {
    source: holders.source,
    target: holders.target,
    moveId: logged.moveId,
    keyed: new Map(keyed.map((k) => [tableKey(k.table), k])),
    logged: new Set(logged.tables.map(tableKey)),
    at: new Map(tables.map((t, i) => [tableKey(t), { source: src.sums[i]!, target: dst.sums[i]! }])),
    logAt: { source: src.logs, target: dst.logs },
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

  // Per table: checksummed whole now, or (pre-verified) from P and its log, or from P minus and plus
  // its changed keys.
  const whole: ChecksumQuery[] = [];
  const lookups: ChecksumQuery[] = [];
  const wholeNames: string[] = [];
  const truncatedNames: string[] = [];
  const filledNames: string[] = [];
  let emptyTables = 0;
  let byKeyTables = 0;
  let byKeyKeys = 0;
  let byLogTables = 0;
  let byLogChanges = 0n;
  const plan = common.map((t) => {
    if (t.empty && onTarget.get(key(t))!.empty) {
      emptyTables += 1;
      return { empty: true };
    }
    const keyed = tail?.pre.keyed.get(key(t));
    const at = tail?.pre.at.get(key(t));
    const changes = tail?.changes.get(key(t));
    if (at && tail?.pre.logged.has(key(t))) {
      byLogTables += 1;
      return { at, logged: true };
    }
    if (!keyed || !at || changes?.truncated || (changes && changes.keys > TAIL_MAX_KEYS)) {
      const names =
        changes?.truncated && keyed && at ? truncatedNames : emptyBefore.has(key(t)) ? filledNames : wholeNames;
      names.push(key(t));
      return { whole: whole.push({ table: t }) - 1 };
    }
    byKeyTables += 1;
    if (!changes || changes.keys === 0) return { at };
    byKeyKeys += changes.keys;
    return { at, lookup: lookups.push({ table: t, keys: { keyed, json: changes.keysJson } }) - 1 };
  });
  const now = [...whole, ...lookups];
  if (now.length > 0) await Promise.all([source.query(STABLE_TEXT_SETTINGS), target.query(STABLE_TEXT_SETTINGS)]);
  const readLogs = (client: pg.Client): Promise<Map<string, LogSums>> =>
    byLogTables > 0 && tail ? readLogSums(client, tail.pre.moveId) : Promise.resolve(new Map<string, LogSums>());
  const [src, dst, srcAtP, dstAtP, srcLog, dstLog] = await Promise.all([
    checksums(source, now, methods),
    checksums(target, now, methods),
    checksums(tail?.pre.source ?? source, lookups, methods),
    checksums(tail?.pre.target ?? target, lookups, methods),
    readLogs(source),
    readLogs(target),
  ]);
  const report = common.map((t, i) => {
    const p = plan[i]!;
    let s: TableChecksum;
    let d: TableChecksum;
    if ('empty' in p) {
      s = d = { rows: 0n, checksum: '0' };
    } else if ('whole' in p && p.whole !== undefined) {
      s = src[p.whole]!;
      d = dst[p.whole]!;
    } else if ('logged' in p) {
      const k = key(t);
      const fromSource = fromLog(p.at.source, tail!.pre.logAt.source.get(k), srcLog.get(k));
      const fromTarget = fromLog(p.at.target, tail!.pre.logAt.target.get(k), dstLog.get(k));
      byLogChanges += fromSource.changes + fromTarget.changes;
      s = fromSource;
      d = fromTarget;
    } else if (p.lookup === undefined) {
      s = p.at!.source;
      d = p.at!.target;
    } else {
      const n = whole.length + p.lookup;
      s = plus(p.at!.source, srcAtP[p.lookup]!, src[n]!);
      d = plus(p.at!.target, dstAtP[p.lookup]!, dst[n]!);
    }
    const match = s.rows === d.rows && s.checksum === d.checksum;
    if (!match) {
      const name =
        t.parent === undefined ? `table ${key(t)}` : `table ${key(t)} (a partition of ${t.schema}.${t.parent})`;
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
