import type { ShardctlConfig } from '../config/types.js';
import { CONTROL } from '../fleet/control.js';
import { renderNextIdSql } from '../id/sql.js';
import type { MigrationFile } from '../migrations/files.js';
import { quoteIdent, quoteLiteral } from '../pg/quote.js';
import { loadSqlTemplate, renderSql } from '../pg/template.js';

/**
 * The SQL of adopting one shard: one transaction per shard, printed as it is by `--dry-run`.
 *
 * The switch, and why no id repeats across it:
 *  1. `ALTER SEQUENCE ... CACHE 1` takes SHARE ROW EXCLUSIVE on the sequence. Every nextval() takes
 *     ROW EXCLUSIVE on it for the rest of its transaction, so the ALTER waits until every
 *     transaction that drew from the sequence has ended, and every later draw (published function
 *     or any other caller) waits for this transaction. From here to COMMIT nothing draws.
 *  2. setval() moves the sequence to a position (shardctl's encoding: ms << sequenceBits | counter)
 *     above the position of every id that can exist: above the largest stored id of every table
 *     whose default calls the function (read now, when every writer that drew has committed or
 *     rolled back), above the clock plus ADOPT_LEAD_MS (the published ids carry the clock of their
 *     call, so this is above the ids of deleted rows too), and above the sequence's own value (a
 *     sequence is never moved back).
 *  3. next_id(seq regclass) (renderNextIdSql: the same function init installs) and the published
 *     name next_id() as a wrapper of it, CREATE OR REPLACE, then the shard's control rows.
 * After COMMIT every new id comes from a position >= that setval, so it is greater than every id
 * made before, per table, and unique. The one exception PostgreSQL leaves is a call of the
 * published body that had already started when the switch committed (it waited for the lock at
 * its nextval(), after looking the function up): it makes one more published id from the clock of
 * that moment, which is below the new positions' time by up to ADOPT_LEAD_MS, so it can neither
 * repeat a new id nor be larger than one, unless that call stalls for longer than ADOPT_LEAD_MS
 * between its nextval() and its clock_timestamp().
 */

/** How far ahead of the clock (ms) the switch puts the sequence: the bound on a straggling published call. */
export const ADOPT_LEAD_MS = 1000;

/** The comment of an adopted shard's zero-argument next_id(): how a later run recognises it. */
export const ADOPTED_WRAPPER_COMMENT = 'shardctl adopted next_id()';

export interface SwitchInput {
  readonly shard: number;
  readonly schema: string;
  /** The sequence the published function draws from (in the shard's schema). */
  readonly sequence: string;
  /** Every table whose column default calls the published function, with that column. */
  readonly tables: readonly { readonly table: string; readonly column: string }[];
  /** Migrations recorded as applied (--baseline). */
  readonly baseline: readonly MigrationFile[];
  readonly lockTimeout: string;
}

/** The position of a stored id, in SQL: its time and counter put together as the sequence holds them. */
function positionOfSql(expression: string, config: ShardctlConfig): string {
  const { shardBits, sequenceBits } = config.idLayout;
  const mask = (1n << BigInt(sequenceBits)) - 1n;
  return `((${expression} >> ${shardBits + sequenceBits}) << ${sequenceBits}) | (${expression} & ${mask})`;
}

export function switchShardSql(config: ShardctlConfig, input: SwitchInput): string {
  const { schema, sequence } = input;
  const layout = config.idLayout;
  const seq = `${quoteIdent(schema)}.${quoteIdent(sequence)}`;
  const stored = input.tables.map(({ table, column }) => {
    const max = `max(${quoteIdent(column)})`;
    return `SELECT ${positionOfSql(max, config)} AS pos FROM ${quoteIdent(schema)}.${quoteIdent(table)}`;
  });
  const storedSql =
    stored.length === 0
      ? '0'
      : `(SELECT coalesce(max(pos), 0) + 1 FROM (\n    ${stored.join('\n    UNION ALL ')}\n  ) AS stored)`;
  return [
    'BEGIN;',
    `SET LOCAL lock_timeout = ${quoteLiteral(input.lockTimeout)};`,
    `-- Waits for every transaction that drew from ${seq}, and holds every new draw until COMMIT.`,
    `ALTER SEQUENCE ${seq} CACHE 1;`,
    `SELECT pg_catalog.setval(${quoteLiteral(seq)}::regclass, GREATEST(`,
    `  ${storedSql},`,
    `  (pg_catalog.floor(EXTRACT(epoch FROM pg_catalog.clock_timestamp()) * 1000)::bigint - ${layout.epochMs} + ${ADOPT_LEAD_MS}) << ${layout.sequenceBits},`,
    `  (SELECT last_value + 1 FROM ${seq})`,
    '));',
    renderNextIdSql(schema, input.shard, layout).trim(),
    adoptedWrapperSql(schema, sequence).trim(),
    ...recordSql(input.shard, schema, input.baseline),
    'COMMIT;',
  ].join('\n');
}

/** The zero-argument next_id() as a wrapper of next_id(seq) for `sequence` (sql/next_id_adopted.sql). */
export function adoptedWrapperSql(schema: string, sequence: string): string {
  return renderSql(loadSqlTemplate('next_id_adopted.sql'), {
    schema: { ident: schema },
    sequenceLiteral: { literal: `${quoteIdent(schema)}.${quoteIdent(sequence)}` },
    commentLiteral: {
      literal: `${ADOPTED_WRAPPER_COMMENT}: shardctl's next_id(${sequence}) under the published name. See README, "Adopting an existing fleet".`,
    },
  });
}

/** A shard already switched by an earlier run that stopped before recording it: the records only. */
export function recordAdoptedSql(shard: number, schema: string, baseline: readonly MigrationFile[]): string {
  return ['BEGIN;', ...recordSql(shard, schema, baseline), 'COMMIT;'].join('\n');
}

function recordSql(shard: number, schema: string, baseline: readonly MigrationFile[]): string[] {
  return [
    `INSERT INTO ${CONTROL}.shards (shard, schema_name) VALUES (${shard}, ${quoteLiteral(schema)}) ON CONFLICT (shard) DO NOTHING;`,
    ...baseline.map(
      (m) =>
        `INSERT INTO ${CONTROL}.migrations (shard, version, name, checksum) VALUES (${shard}, ${m.version}, ${quoteLiteral(m.name)}, ${quoteLiteral(m.checksum)}) ON CONFLICT (shard, version) DO NOTHING;`,
    ),
  ];
}
