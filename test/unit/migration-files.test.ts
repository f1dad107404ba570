import { describe, expect, it } from 'vitest';
import { hasNoTransactionMarker, splitStatements } from '../../src/migrations/files.js';

describe('migration files', () => {
  it('finds the no-transaction marker only among the comment lines at the top', () => {
    expect(hasNoTransactionMarker('-- shardctl:no-transaction\nCREATE INDEX CONCURRENTLY i ON t (x);')).toBe(true);
    expect(hasNoTransactionMarker('\n-- Builds an index.\n-- SHARDCTL:NO-TRANSACTION\nCREATE INDEX CONCURRENTLY i ON t (x);')).toBe(true);
    expect(hasNoTransactionMarker('CREATE TABLE t (x int);\n-- shardctl:no-transaction\n')).toBe(false);
  });

  it('splits a file into statements at the semicolons the server would end them at', () => {
    expect(splitStatements('-- shardctl:no-transaction\nCREATE INDEX CONCURRENTLY a ON t (x);\nCREATE INDEX CONCURRENTLY b ON t (y);\n-- done\n')).toEqual([
      '-- shardctl:no-transaction\nCREATE INDEX CONCURRENTLY a ON t (x)',
      'CREATE INDEX CONCURRENTLY b ON t (y)',
    ]);
    expect(splitStatements(`INSERT INTO t VALUES ('a;b', E'c\\';d', "x;y"); SELECT 1`)).toEqual([
      `INSERT INTO t VALUES ('a;b', E'c\\';d', "x;y")`,
      'SELECT 1',
    ]);
    expect(splitStatements('DO $body$ BEGIN PERFORM 1; END $body$; SELECT $$;$$; SELECT a$b FROM t')).toEqual([
      'DO $body$ BEGIN PERFORM 1; END $body$',
      'SELECT $$;$$',
      'SELECT a$b FROM t',
    ]);
    expect(splitStatements("/* a; /* nested; */ still; */ SELECT 'it''s;' -- trailing; comment\n;")).toEqual([
      "/* a; /* nested; */ still; */ SELECT 'it''s;' -- trailing; comment",
    ]);
    expect(splitStatements('-- only a comment;\n  ;  \n')).toEqual([]);
  });
});
