/**
 * next_id v5, the previous release's function, for before/after rows in the benchmarks: the
 * template kept as a test fixture (test/fixtures/next_id.v5.sql), rendered with that release's
 * parameters. test/fixtures/previous-next-id.ts does the same for the tests (TypeScript over src/,
 * which the benchmarks, plain JavaScript over dist/, cannot import).
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { describeLayout, formatUnixMs, layoutEndUnixMs, maxTimeOffsetMs, timeBits } from '../dist/id/layout.js';
import { ID_LOCK_CLASS } from '../dist/id/sql.js';
import { renderSql } from '../dist/pg/template.js';
import { REPO_ROOT } from './lib.js';

export const PREVIOUS_VERSION = 5;

export function renderPreviousNextIdSql(schema, shard, layout) {
  const template = readFileSync(path.join(REPO_ROOT, 'test', 'fixtures', `next_id.v${PREVIOUS_VERSION}.sql`), 'utf8');
  const seqBits = BigInt(layout.sequenceBits);
  const positionBits = BigInt(timeBits(layout)) + seqBits;
  return renderSql(template, {
    schema: { ident: schema },
    schemaLiteral: { literal: schema },
    timeBits: { int: timeBits(layout) },
    shardBits: { int: layout.shardBits },
    sequenceBits: { int: layout.sequenceBits },
    lagMs: { int: 1 },
    epochMs: { int: layout.epochMs },
    acceptBeforeLiteral: { literal: new Date(Number(layout.epochMs + 2n)).toISOString() },
    minPosition: { int: 1n << seqBits },
    maxPosition: { int: (1n << positionBits) - 1n },
    maxTimeMs: { int: maxTimeOffsetMs(layout) },
    timeShift: { int: layout.sequenceBits + layout.shardBits },
    shardField: { int: BigInt(shard) << seqBits },
    sequenceMask: { int: (1n << seqBits) - 1n },
    idMinusPositionPerMs: { int: (1n << BigInt(layout.sequenceBits + layout.shardBits)) - (1n << seqBits) },
    lockClass: { int: ID_LOCK_CLASS },
    layoutLiteral: { literal: describeLayout(layout) },
    layoutEndLiteral: { literal: formatUnixMs(layoutEndUnixMs(layout)) },
    commentLiteral: { literal: `shardctl next_id v${PREVIOUS_VERSION}: 64-bit ids for shard ${shard} (${describeLayout(layout)}). See docs/ids.md.` },
  });
}
