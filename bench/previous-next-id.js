/**
 * next_id v6, the previous release's function, for before/after rows in the benchmarks: rendered
 * by the tests' renderer of earlier releases (test/fixtures/previous-next-id.ts, TypeScript over
 * src/, loaded through tsx), so the tests and the benchmarks install the same text.
 */
import { tsImport } from 'tsx/esm/api';

export const PREVIOUS_VERSION = 6;

const { renderNextIdReleaseSql } = await tsImport('../test/fixtures/previous-next-id.ts', import.meta.url);

export function renderPreviousNextIdSql(schema, shard, layout) {
  return renderNextIdReleaseSql(PREVIOUS_VERSION, schema, shard, layout);
}
