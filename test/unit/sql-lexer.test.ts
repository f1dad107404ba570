import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { blockNeutral, firstEscape, splitSql, splitSqlBothWays, transactionEscape } from '../../src/pg/statements.js';
import { execRefusal } from '../../src/commands/exec.js';
import { migrationFileProblems } from '../../src/migrations/files.js';

const texts = (sql: string) => splitSql(sql).statements.map((s) => s.text);
const keywords = (sql: string) => splitSql(sql).statements.map((s) => s.keywords.join(' '));

/** Text that the server reads as one opaque token (or nothing), whatever the random content holds. */
const hostile = fc.string({
  unit: fc.constantFrom('a', ';', "'", '"', '$', '-', '/', '*', '\\', '\n', ' ', 'commit', 'E', 'x'),
});
const opaque = fc.oneof(
  // A backslash before a quote in '…' reads differently with standard_conforming_strings off, and
  // checks run over both readings: tested apart.
  hostile.map((s) => `'${s.replaceAll('\\', '').replaceAll("'", "''")}'`),
  hostile.map((s) => `E'${s.replaceAll('\\', '\\\\').replaceAll("'", "\\'")}'`),
  hostile.map((s) => `"${s.replaceAll('"', '""')}"`),
  hostile.filter((s) => !s.includes('$q$')).map((s) => `$q$${s}$q$`),
  hostile.filter((s) => !s.includes('$$') && !s.endsWith('$')).map((s) => `$$${s}$$`),
  hostile.filter((s) => !/[\r\n]/.test(s)).map((s) => `--${s}\n`),
  hostile
    .filter((s) => !s.includes('*/') && !s.includes('/*') && !s.endsWith('/') && !s.startsWith('*'))
    .map((s) => `/*${s}*/`),
);

describe('splitSql', () => {
  it('splits at the semicolons the server ends statements at, with each statement line', () => {
    const { statements, unterminated } = splitSql("select 1;\n\n  SELECT ';' ; -- c;\n/* x; */ commit");
    expect(unterminated).toBe(false);
    expect(statements.map((s) => [s.line, s.text, s.keywords])).toEqual([
      [1, 'select 1', ['select']],
      [3, "SELECT ';'", ['select']],
      [4, '-- c;\n/* x; */ commit', ['commit']],
    ]);
  });

  it.each([
    ["select 'it''s; commit'", 1],
    ["select E'a\\'; commit; b'", 1],
    ['select "a"";commit" from t', 1],
    ['select $$;commit;$$, $tag$ $$; commit $tag$', 1],
    ['select $1; commit', 2],
    ['select a$b; commit', 2],
    ['/* a /* nested; */ still; commit */ select 1', 1],
    ['select 1 -- ; commit\n', 1],
    ["select U&'d\\0061t;a', B'01', X'ff'; commit", 2],
    [
      'create function f() returns int language sql begin atomic select 1; select case when true then 2 end; end; commit',
      2,
    ],
    ['create or replace procedure p() language sql begin atomic insert into t values (1); end; select 1', 2],
    // `begin` as a name is no body: the statements after it are statements (a COMMIT among them).
    [
      "create function span(begin bigint, finish bigint) returns bigint language sql as 'select finish - begin'; commit; select 1 as end",
      3,
    ],
    ['create function f(begin int) returns int language sql begin atomic select begin + 1; end; commit', 2],
  ])('%s: %i statements', (sql, count) => {
    expect(texts(sql)).toHaveLength(count);
  });

  it('gives each statement its leading keywords, lower-cased', () => {
    expect(
      keywords('SET LOCAL lock_timeout = 1; Set Search_Path TO public; (select 1); ROLLBACK TO SAVEPOINT a'),
    ).toEqual(['set local lock_timeout', 'set search_path to public', '', 'rollback to savepoint a']);
  });

  it('says when a string, identifier, dollar quote or comment is left open', () => {
    for (const sql of ["select 'a", 'select "a', 'select $x$ a', 'select /* a /* b */', "select E'a\\'"])
      expect(splitSql(sql).unterminated).toBe(true);
    expect(splitSql("select 'a' -- no newline").unterminated).toBe(false);
  });

  it('reads both ways where standard_conforming_strings decides', () => {
    // On: 'a\' is a string and COMMIT follows. Off: \' escapes and the quote runs to the end.
    const sql = "select 'a\\'; commit; select '";
    expect(splitSql(sql).statements.map((s) => s.keywords[0])).toEqual(['select', 'commit', 'select']);
    expect(splitSql(sql, { backslashQuotes: true }).statements).toHaveLength(1);
    // On: 'x\'' runs on to the last quote and hides COMMIT. Off: 'x\'' ends, and COMMIT is code.
    const hidden = "select 'x\\'' ; commit; --'";
    expect(splitSql(hidden).statements.map((s) => s.keywords[0])).toEqual(['select']);
    expect(splitSql(hidden, { backslashQuotes: true }).statements.map((s) => s.keywords[0])).toEqual([
      'select',
      'commit',
    ]);
    expect(splitSqlBothWays(hidden).map((s) => s.keywords[0])).toEqual(['select', 'select', 'commit']);
    expect(execRefusal(hidden, false)).toContain('as read with standard_conforming_strings off');
    // A reading that leaves a quote open runs nothing on a server that reads it so: only the other counts.
    expect(splitSqlBothWays("select '\\'; select 1").map((s) => s.text)).toEqual(["select '\\'", 'select 1']);
  });

  it('never splits inside a string, identifier, dollar quote or comment (property)', () => {
    fc.assert(
      fc.property(fc.array(fc.array(opaque, { maxLength: 4 }), { minLength: 1, maxLength: 5 }), (parts) => {
        const sql = parts.map((opaques) => `select ${opaques.join(' ')} 1`).join(';\n');
        const { statements, unterminated } = splitSql(sql);
        expect(unterminated).toBe(false);
        expect(statements).toHaveLength(parts.length);
        expect(statements.every((s) => s.keywords[0] === 'select' && transactionEscape(s) === undefined)).toBe(true);
        expect(execRefusal(sql, false)).toBeUndefined();
      }),
      { numRuns: 500 },
    );
  });

  it('finds every top-level COMMIT among opaque text, on the right line (property)', () => {
    fc.assert(
      fc.property(
        fc.array(fc.tuple(fc.boolean(), fc.array(opaque, { maxLength: 3 })), { minLength: 1, maxLength: 6 }),
        (parts) => {
          const sql = parts
            .map(([commit, opaques]) => (commit ? `commit ${opaques.join(' ')}` : `select ${opaques.join(' ')} 1`))
            .join(';\n');
          const statements = splitSql(sql).statements;
          expect(statements.map((s) => s.keywords[0])).toEqual(parts.map(([commit]) => (commit ? 'commit' : 'select')));
          let line = 1;
          parts.forEach(([, opaques], i) => {
            expect(statements[i]!.line).toBe(line);
            line += `${opaques.join(' ')}\n`.split('\n').length - 1;
          });
        },
      ),
      { numRuns: 300 },
    );
  });
});

describe('transactionEscape', () => {
  const first = (sql: string) => transactionEscape(splitSql(sql).statements[0]!);
  it.each([
    'COMMIT',
    'commit prepared $$x$$',
    'END',
    'ABORT',
    'ROLLBACK',
    'rollback prepared $$x$$',
    'BEGIN',
    'start transaction read write',
    "PREPARE TRANSACTION 'x'",
    'SET search_path TO public',
    'set session search_path = public',
    'SET lock_timeout = 1',
    'SET ROLE x',
    'SET SESSION AUTHORIZATION x',
    "SET SCHEMA 'public'",
    'SET LOCAL search_path TO public',
    'SET LOCAL "search_path" TO public',
    'SET LOCAL ROLE x',
    'SET LOCAL SESSION AUTHORIZATION x',
    'RESET ALL',
    'RESET search_path',
    'DISCARD ALL',
    "select set_config('search_path', 'public', false)",
    `select "pg_catalog"."set_config"('search_path', 'public', true)`,
    `select U&"set\\005fconfig"('search_path', 'public', true)`,
    `select U&"set!005fconfig" UESCAPE '!' ('search_path', 'public', true)`,
    "update pg_settings set setting = 'public' where name = 'search_path'",
    "select set_config('app.user_id', $1, false)",
    "select set_config('app.user_id', $1)",
    "select set_config($1, 'x', true)",
    "select set_config('app.user_id', lower($1), true)",
    "select set_config('app.user_id', 'x', $2)",
    "select set_config('SEARCH_PATH', 'public', true)",
    "select set_config('role', 'x', true), 1",
    "select set_config('app.a', '1', true), set_config('search_path', 'public', true)",
    // What a connection keeps after the transaction, for its next user (through a pooler: another client's).
    'PREPARE q AS SELECT 1',
    'LISTEN channel',
    'declare c cursor with hold for select 1',
    'CREATE TEMP TABLE photos (id bigint)',
    'create temporary table t as select 1',
    'create local temp table t (x int) on commit delete rows',
    // EXPLAIN ANALYZE runs the statement it explains.
    'EXPLAIN ANALYZE CREATE TEMP TABLE photos AS SELECT 1',
    'explain (analyze, costs off) create temporary table t as select 1',
    'explain analyze verbose create table pg_temp.photos as select 1',
    'create temporary sequence s',
    'create or replace temp view v as select 1',
    'select * into temp photos from photos where user_id = $1',
    'SELECT 1 AS x INTO TEMPORARY TABLE t',
    'select 1 into local temp t',
    'select * into pg_temp.photos from photos',
    'select * into table pg_temp.photos from photos',
    'with a as (select 1) select * into temporary t from a',
    'create table pg_temp.photos (id bigint)',
    'CREATE VIEW "pg_temp".v AS SELECT 1',
    'create function pg_temp.f() returns int language sql as $$ select 1 $$',
    'create sequence if not exists pg_temp.s',
    'create view v as select * from pg_temp.t',
    'create or replace recursive view v (n) as select 1 from pg_temp.t',
    'select pg_advisory_lock(1)',
    'select pg_catalog.pg_try_advisory_lock_shared(1, 2)',
    "do $$ begin perform set_config('search_path', 'insta0', true); end $$",
    'DO $x$ BEGIN SET search_path TO insta0; END $x$',
    "do 'begin perform pg_advisory_lock(1); end'",
    'do $$ begin reset all; end $$',
    'do language plpgsql $$ begin set work_mem = 1000; end $$',
  ])('refuses %s', (sql) => {
    expect(first(sql)).toBeDefined();
  });

  // What a statement of its own is refused for, started by PL/pgSQL (first, or after BEGIN, THEN,
  // ELSE or LOOP): the router reads a DO body so; a migration file's check does not (a file an
  // earlier release applied must still load).
  it.each([
    'DO $$BEGIN CREATE TEMP TABLE photos (LIKE photos INCLUDING ALL); END$$',
    'do $$ declare n int; begin if true then create temporary table t (x int); end if; end $$',
    'do $$ begin create function pg_temp.f() returns int language sql as $f$ select 1 $f$; end $$',
    'do $$ begin loop listen ch; exit; end loop; end $$',
    'do $$ begin prepare p as select 1; end $$',
    'do $$ begin if false then null; else discard temp; end if; end $$',
  ])('the router refuses %s; a migration file may hold it', (sql) => {
    expect(firstEscape(sql)).toBeDefined();
    expect(first(sql)).toBeUndefined();
  });

  // The same words where PL/pgSQL starts no statement: a column, a variable, a qualified name;
  // EXECUTE of a trigger's function and GRANT EXECUTE are no dynamic SQL.
  it.each([
    'do $$ begin update photos set discard = true where id = 1; end $$',
    "do $$ begin if true then update photos set caption = 'x' where id = 1; end if; end $$",
    'do $$ declare prepare int := 1; begin perform p.discard from photos p; insert into t (listen) values (prepare); end $$',
    'do $$ begin create trigger t after insert on photos for each row execute function f(); grant execute on function f() to app; end $$',
    'do $$ begin create temp table t (x int) on commit drop; insert into t values (1); end $$',
  ])('the router allows %s', (sql) => {
    expect(firstEscape(sql)).toBeUndefined();
    expect(first(sql)).toBeUndefined();
  });

  // EXECUTE's SQL is made as the block runs and cannot be read: the router refuses it whatever it
  // says (firstEscape); migrations and exec, which use it for dynamic DDL, allow it.
  it.each([
    "DO $$BEGIN EXECUTE 'SET ROLE pg_monitor'; END$$",
    "do $$ begin execute format('set work_mem = %L', '64MB'); end $$",
    "do $$ begin if true then execute 'select 1'; end if; end $$",
    "do $$ declare r record; begin for r in execute 'select 1' loop null; end loop; end $$",
  ])('the router refuses %s; migrations allow it', (sql) => {
    expect(firstEscape(sql)).toContain('DO: EXECUTE runs SQL text made as the block runs');
    expect(first(sql)).toBeUndefined();
  });

  it.each([
    'SET LOCAL lock_timeout = 1000',
    "set local statement_timeout to '5s'",
    'SET TRANSACTION ISOLATION LEVEL SERIALIZABLE',
    'SET CONSTRAINTS ALL DEFERRED',
    'SAVEPOINT a',
    'RELEASE SAVEPOINT a',
    'ROLLBACK TO SAVEPOINT a',
    'declare c cursor for select 1',
    'CREATE TEMP TABLE t (x int) ON COMMIT DROP',
    'EXPLAIN ANALYZE SELECT 1',
    'explain (analyze, format json) create temp table t on commit drop as select 1',
    'EXPLAIN SELECT * FROM photos',
    'create table temp (x int)',
    'insert into temp values (1)',
    'insert into temp select 1',
    'merge into temp using src on true when matched then do nothing',
    'select * into photos_copy from photos',
    'select * from pg_temp.t',
    'create table pg_temp.t (x int) on commit drop',
    'select 1 as "pg_temp"',
    'create table photos_copy as select * from pg_temp.photos',
    'create table photos_copy (like pg_temp.photos)',
    'create index on pg_temp.photos (id)',
    'select pg_advisory_xact_lock(1)',
    'do $$ begin perform 1; set local work_mem = 1000; end $$',
    "do $$ begin insert into t values ('set_config'); end $$",
    'do $$ begin create temp table t (x int) on commit drop; insert into t values (1); end $$',
    "do $$ begin raise notice 'execute listen prepare'; end $$",
    'do $$ declare c cursor for select 1; begin open c; close c; end $$',
    'do $$ begin create table photos_copy as select * from pg_temp.photos; end $$',
    "select set_config('app.user_id', $1, true)",
    "SELECT pg_catalog.set_config('statement_timeout', '5s', TRUE)",
    "select set_config('app.tenant', $1::text, true), set_config('app.user', 'u' || $2, true)",
    "select 'commit; set search_path to public'",
    'create function f() returns void language plpgsql as $$ begin commit; end $$',
    'select "commit" from t',
  ])('allows %s', (sql) => {
    expect(first(sql)).toBeUndefined();
  });
});

describe('execRefusal', () => {
  it.each([
    [
      'set transaction read write; insert into photos(user_id) values (42) returning id',
      'statement 1 "set transaction read write": SET is not a read',
    ],
    ['commit; insert into photos(user_id) values (1)', 'statement 1 "commit": COMMIT ends or starts a transaction'],
    ['select 1; commit; create table public.t(x int)', 'statement 2 "commit": COMMIT'],
    ['select 1;\n delete from photos', 'statement 2 (line 2) "delete from photos": DELETE is not a read'],
    ["copy (select 1) to program 'true'", 'the statement "copy (select 1) to program \'true\'": COPY is not a read'],
    ["select set_config('search_path','public',false)", 'set_config() changes a setting'],
    ['select pg_advisory_lock(1)', 'pg_advisory_lock() holds its lock after the transaction'],
    ["select lo_export(1, '/tmp/x')", 'lo_export acts outside the transaction'],
    ["select * from dblink('x', 'delete from t') as t(x int)", 'dblink acts outside'],
    ["select pg_notify('c', 'x')", 'pg_notify acts outside'],
    ['do $$ begin perform 1; end $$', 'DO is not a read'],
    ['call p()', 'CALL is not a read'],
    ['prepare q as select 1', 'PREPARE keeps a prepared statement on the connection'],
    // A read-only transaction may create a temporary table; the shards after it on the connection would read it.
    ['select * into temp photos from photos', 'a temporary table'],
    // EXPLAIN ANALYZE runs what it explains, a CREATE TABLE … AS included (allowed in a read-only transaction when temporary).
    ['explain analyze create temp table photos as select 1', 'a temporary table'],
  ])('refuses %s', (sql, reason) => {
    expect(execRefusal(sql, false)).toContain(reason);
  });

  it.each([
    'select count(*) from photos',
    'with x as (select 1 as n) select n from x',
    '(select 1) union (select 2)',
    'values (1), (2)',
    'table photos',
    'show search_path',
    'explain select * from photos',
    'select \'commit; delete from photos\', "set_config", set_config from t -- ; drop table t\n',
    "select regexp_replace(x, '\\s+', ' ') from t",
    'select 1;;',
  ])('runs %s read-only', (sql) => {
    expect(execRefusal(sql, false)).toBeUndefined();
  });

  it('with --write allows writes but not what ends the shard transaction or changes the session', () => {
    expect(execRefusal('insert into t values (1); delete from t', true)).toBeUndefined();
    expect(execRefusal('insert into t values (1); commit; delete from t', true)).toContain('COMMIT');
    expect(execRefusal('set search_path to public; delete from t', true)).toContain('SET outlives');
  });
});

describe('migrationFileProblems', () => {
  it('names the line of each statement that ends the transaction or changes the session', () => {
    expect(
      migrationFileProblems('CREATE TABLE a2(x int);\nCOMMIT;\nCREATE TABLE b2(x int);', false).map((p) => p.line),
    ).toEqual([2]);
    expect(migrationFileProblems('CREATE TABLE e2(x int); ROLLBACK; BEGIN;', false).map((p) => p.statement)).toEqual([
      'ROLLBACK',
      'BEGIN',
    ]);
    expect(
      migrationFileProblems('-- x\n\nSET search_path TO public;\nRESET ALL;\nSET ROLE x;', false).map((p) => p.line),
    ).toEqual([3, 4, 5]);
  });

  it("allows a DO block that backfills with UPDATE … SET (its SET is UPDATE's, not a setting's), and one that runs EXECUTE", () => {
    const file = [
      "DO $$ BEGIN UPDATE photos SET caption = 'x' WHERE caption IS NULL; END $$;",
      "DO $$ DECLARE t text; BEGIN FOR t IN SELECT 'photos' LOOP EXECUTE format('ANALYZE %I', t); END LOOP; END $$;",
      "DO $$ BEGIN IF true THEN SET LOCAL work_mem = '64MB'; END IF; END $$;",
    ].join('\n');
    expect(migrationFileProblems(file, false)).toEqual([]);
    expect(
      migrationFileProblems("DO $$ BEGIN IF true THEN SET work_mem = '64MB'; END IF; END $$;", false),
    ).toHaveLength(1);
  });

  it('allows SET LOCAL of other settings, savepoints, and COMMIT inside bodies, strings and identifiers', () => {
    const file = [
      "SET LOCAL lock_timeout = '1s';",
      'SAVEPOINT s; RELEASE SAVEPOINT s;',
      'CREATE PROCEDURE p() LANGUAGE plpgsql AS $body$ BEGIN COMMIT; END $body$;',
      'CREATE TABLE "commit;" (x text DEFAULT \'rollback; set role x\'); -- commit;',
      '/* COMMIT; */ CREATE FUNCTION f() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1; END;',
    ].join('\n');
    expect(migrationFileProblems(file, false)).toEqual([]);
  });

  it('refuses savepoints and SET LOCAL in a no-transaction file', () => {
    expect(
      migrationFileProblems(
        '-- shardctl:no-transaction\nSAVEPOINT a;\nSET LOCAL lock_timeout = 1;\nCREATE INDEX CONCURRENTLY i ON t (x);',
        true,
      ).map((p) => p.line),
    ).toEqual([2, 3]);
  });
});

describe('blockNeutral', () => {
  it('takes one query or write of rows, and nothing that needs a block, may commit inside, or is more than one statement', () => {
    for (const sql of [
      'insert into photos (user_id) values ($1)',
      '  INSERT INTO photos VALUES ($1) RETURNING id;',
      '-- a comment\nselect $1::int',
      'with x as (delete from t where id = $1 returning *) select * from x',
      'update t set a = $1',
      'delete from t where id = $1',
      'merge into t using s on t.id = s.id when matched then delete',
      'values ($1)',
      'table t',
      "select 'a;b', $1",
    ])
      expect(blockNeutral(sql), sql).toBe(true);
    for (const sql of [
      'lock table photos in share mode',
      'declare c cursor for select 1',
      'savepoint a',
      'set local statement_timeout = 1',
      'call p($1)',
      'do $$ begin commit; end $$',
      'select 1; select 2',
      '',
      '(select 1)',
      "select 'a\\'; commit; --'",
    ])
      expect(blockNeutral(sql), sql).toBe(false);
  });
});

describe('migrationFileProblems and text left open', () => {
  it('refuses a file that ends inside a comment, string, quoted name or dollar quote (it would take in the record, COMMIT and the next file sent after it)', () => {
    for (const file of [
      'CREATE TABLE u1 (x int);\n/* a note',
      "CREATE TABLE u1 (x int);\nCOMMENT ON TABLE u1 IS 'it''s",
      'CREATE TABLE "u1 (x int);',
      'CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $body$ SELECT 1;\n',
    ]) {
      const problems = migrationFileProblems(file, false);
      expect(problems.map((p) => p.reason)).toEqual([expect.stringContaining('never closes')]);
      expect(problems[0]!.line).toBe(file.trimEnd().split('\n').length);
      expect(migrationFileProblems(file, true)).toHaveLength(1);
    }
    // Closed, the same texts are fine.
    expect(migrationFileProblems('CREATE TABLE u1 (x int);\n/* a note */\n', false)).toEqual([]);
    expect(migrationFileProblems("SELECT 'C:\\';", false)).toEqual([]);
  });
});
