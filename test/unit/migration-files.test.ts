import { describe, expect, it } from 'vitest';
import {
  hasNoTransactionMarker,
  migrationNameProblem,
  readMarkers,
  splitStatements,
} from '../../src/migrations/files.js';

describe('migration files', () => {
  it('finds the no-transaction marker only among the comment lines at the top', () => {
    expect(hasNoTransactionMarker('-- shardctl:no-transaction\nCREATE INDEX CONCURRENTLY i ON t (x);')).toBe(true);
    expect(
      hasNoTransactionMarker(
        '\n-- Builds an index.\n-- SHARDCTL:NO-TRANSACTION\nCREATE INDEX CONCURRENTLY i ON t (x);',
      ),
    ).toBe(true);
    expect(hasNoTransactionMarker('CREATE TABLE t (x int);\n-- shardctl:no-transaction\n')).toBe(false);
  });

  it('reads the lock-timeout and statement-timeout markers among the comment lines at the top', () => {
    expect(
      readMarkers(
        '-- Adds views.\n-- shardctl:lock-timeout 2s\n-- shardctl:statement-timeout 10min\nALTER TABLE photos ADD COLUMN v int;',
      ),
    ).toEqual({
      noTransaction: false,
      lockTimeout: '2s',
      statementTimeout: '10min',
      problems: [],
    });
    expect(readMarkers('ALTER TABLE photos ADD COLUMN v int;\n-- shardctl:lock-timeout 2s\n').lockTimeout).toBeNull();
  });

  it.each([
    [
      '-- shardctl:lock-timeout 2 seconds',
      '-- shardctl:lock-timeout "2 seconds": expected a duration above 0 such as 500ms, 5s or 2min',
    ],
    ['-- shardctl:lock-timeout 0ms', '-- shardctl:lock-timeout "0ms": expected a duration above 0'],
    ['-- shardctl:statement-timeout', '-- shardctl:statement-timeout "": expected a duration'],
    [
      '-- shardctl:lock_timeout 2s',
      'unknown marker "-- shardctl:lock_timeout 2s" (known markers: -- shardctl:no-transaction, -- shardctl:lock-timeout DURATION',
    ],
    ['-- shardctl:no-transaction please', '-- shardctl:no-transaction takes no value, got "please"'],
  ])('refuses the marker line %j, saying why', (line, message) => {
    const { problems } = readMarkers(`-- header\n${line}\nSELECT 1;`);
    expect(problems).toHaveLength(1);
    expect(problems[0]!.line).toBe(2);
    expect(problems[0]!.message).toContain(message);
  });

  it.each(['add_views', 'AddViews', 'v2.1-fix'])('accepts the migration name %j', (name) =>
    expect(migrationNameProblem(name)).toBeNull(),
  );
  it.each(['', '_x', 'add views', 'a/b', 'views.sql?', 'émoji'])('refuses the migration name %j', (name) =>
    expect(migrationNameProblem(name)).toMatch(/expected letters/),
  );
  it('refuses a name too long for a file name, and accepts one at the limit', () => {
    expect(migrationNameProblem('x'.repeat(300))).toBe(
      'is 300 characters long; at most 200, so that NNNN_<name>.sql fits a file name (255 bytes)',
    );
    expect(migrationNameProblem('x'.repeat(200))).toBeNull();
  });

  it('splits a file into statements at the semicolons the server would end them at', () => {
    expect(
      splitStatements(
        '-- shardctl:no-transaction\nCREATE INDEX CONCURRENTLY a ON t (x);\nCREATE INDEX CONCURRENTLY b ON t (y);\n-- done\n',
      ),
    ).toEqual([
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
