import { describe, expect, it } from 'vitest';
import type { Sql } from '../../src/pg/sql-template.js';
import { createPublicationSql, PUBLISHED_TABLES_SQL } from '../../src/moves/sql/replication.js';
import { ALL_PAGELESS_SQL } from '../../src/moves/pageless.js';

describe('a move’s publication', () => {
  it('names each table of the shards and only this move’s marker rows', () => {
    expect(createPublicationSql('shardctl_move_m1', ['"insta1"."photos"', '"insta2"."likes"'] as Sql[], 'm1')).toBe(
      `CREATE PUBLICATION "shardctl_move_m1" FOR TABLE "insta1"."photos", "insta2"."likes", "shardctl".move_markers WHERE (move_id = 'm1')`,
    );
  });

  it('publishes only the marker rows of a move whose shards hold no table', () => {
    expect(createPublicationSql('shardctl_move_m1', [], 'm1')).toBe(
      `CREATE PUBLICATION "shardctl_move_m1" FOR TABLE "shardctl".move_markers WHERE (move_id = 'm1')`,
    );
  });

  it('takes permanent plain tables and partitions, the schemas bound as a parameter', () => {
    expect(PUBLISHED_TABLES_SQL).toContain(`c.relkind = 'r' AND c.relpersistence = 'p'`);
    expect(PUBLISHED_TABLES_SQL).toContain('n.nspname = ANY($1::text[])');
  });
});

describe('the copy’s test for tables without a page', () => {
  it('binds the names and counts a table that does not exist as holding rows', () => {
    expect(ALL_PAGELESS_SQL).toContain('unnest($1::text[])');
    expect(ALL_PAGELESS_SQL).toContain('coalesce(pg_catalog.pg_relation_size(pg_catalog.to_regclass(t)) = 0, false)');
  });
});
