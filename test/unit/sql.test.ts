import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { DEFAULT_ID_LAYOUT } from '../../src/id/layout.js';
import {
  ID_FUNCTION_VERSION,
  ID_LOCK_TABLES,
  ID_LOCKS_SCHEMA,
  renderNextIdControlSql,
  renderNextIdSql,
  SLOW_PATH_CHANGING_COMMENT,
  SLOW_PATH_COMMENT,
} from '../../src/id/sql.js';
import { CONTROL_SCHEMA } from '../../src/fleet/control.js';
import { quoteIdent, quoteLiteral } from '../../src/pg/quote.js';
import { redact, redactedJson, redactUrl, registerSecret, registerUrlSecret } from '../../src/pg/redact.js';
import { renderSql } from '../../src/pg/template.js';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { ident, int, list, lit, lockWait, sql, type Sql } from '../../src/pg/sql-template.js';
import { shardMovedRaiseSql } from '../../src/fleet/control.js';
import { placementVersionSql, switchPlacementSql } from '../../src/fleet/placement.js';
import { fenceGuardSql, fenceReadsSql, prepareSequencesReadSql } from '../../src/moves/sql/fence.js';

describe('SQL templates', () => {
  it('fills next_id with bigint-safe constants: the shard in its own bits, shifts on bigint values', () => {
    const sql = renderNextIdSql('insta5', 5, DEFAULT_ID_LAYOUT);
    expect(sql).toContain('CREATE OR REPLACE FUNCTION "insta5".next_id(seq regclass)');
    // ((pos >> 10) << 23) | (5 << 10) | (pos & 1023), written as pos + (pos >> 10) * (2^23 - 2^10) + (5 << 10).
    expect(sql).toContain('(pg_catalog.currval(seq) >> 10) * 8387584 + 5120');
    expect(sql).toContain('ELSE "shardctl".next_id_locked(seq, 5)');
    expect(sql).not.toMatch(/\{\{\w+\}\}/);
    // The host's slow path: the shard is an argument, shifted as a bigint.
    const control = renderNextIdControlSql(DEFAULT_ID_LAYOUT, 'insta');
    expect(control).toContain('THEN pos + (pos >> 10) * 8387584 + (shard::bigint << 10)');
    expect(control).toContain('RETURN pos + (pos >> 10) * 8387584 + (shard::bigint << 10);');
    expect(control).toContain('AND pos <= 1125899906842623'); // 2^50 - 1: 40 time bits + 10 sequence bits
    expect(control).toContain('OR shard > 8191'); // 13 shard bits
    expect(control).toContain(`pg_catalog.quote_ident('insta' || shard::text)`);
    expect(control).not.toMatch(/\{\{\w+\}\}/);
  });

  it("keeps no PL/pgSQL in a new shard schema: next_id() is SQL, the slow path is the control schema's", () => {
    const fresh = renderNextIdSql('insta5', 5, DEFAULT_ID_LAYOUT, { fresh: true });
    expect(fresh).not.toMatch(/plpgsql/i);
    expect(fresh.match(/CREATE OR REPLACE FUNCTION/g)).toHaveLength(1);
    // An upgrade of an existing schema hands an earlier per-shard slow path over (one statement)
    // and drops next_id_fast.
    const upgrade = renderNextIdSql('insta5', 5, DEFAULT_ID_LAYOUT);
    expect(upgrade).toContain('RETURN "shardctl".next_id_locked(seq, 5);');
    expect(upgrade).toContain('DROP FUNCTION IF EXISTS "insta5".next_id_fast(regclass, bigint);');
  });

  it('makes next_id() one inlinable SQL expression: one draw, decided by one condition, the position read back twice for the id', () => {
    const sql = renderNextIdSql('insta5', 5, DEFAULT_ID_LAYOUT);
    const nextId = sql.slice(sql.indexOf('CREATE OR REPLACE FUNCTION "insta5".next_id(seq regclass)'));
    expect(nextId).toContain('LANGUAGE sql VOLATILE');
    expect(nextId.match(/nextval\(/g)).toHaveLength(1);
    const [, condition, id] =
      /RETURN CASE\s+WHEN (.*?)\s+THEN (.*?)\s+ELSE "shardctl"\.next_id_locked\(seq, 5\)\s+END;/s.exec(nextId)!;
    // The draw and the clock are in the condition; currval() only in the result, which CASE
    // evaluates after its condition.
    expect(condition).toContain('pg_catalog.nextval(seq)');
    expect(condition).not.toContain('currval');
    expect(id!.match(/pg_catalog\.currval\(seq\)/g)).toHaveLength(2);
    // next_id_fast()'s id, with pos read back by currval() and the shard a constant: the same ids.
    const control = renderNextIdControlSql(DEFAULT_ID_LAYOUT, 'insta');
    const fast = control.slice(control.indexOf('CREATE OR REPLACE FUNCTION "shardctl".next_id_fast'));
    const [, , fastId] = /RETURN CASE\s+WHEN (.*?)\s+THEN (.*?)\s+ELSE "shardctl"\.next_id_locked\(seq, shard\)/s.exec(
      fast,
    )!;
    expect(id!.replaceAll(/\s+/g, ' ')).toBe(
      fastId!
        .replaceAll('pos', 'pg_catalog.currval(seq)')
        .replace('(shard::bigint << 10)', '5120')
        .replaceAll(/\s+/g, ' '),
    );
    expect(condition!.replaceAll(/\s+/g, ' ')).toBe(
      "'2011-08-24T21:07:01.723Z'::timestamptz + ((pg_catalog.nextval(seq) << 13) >> 23) * interval '1 millisecond' > GREATEST(pg_catalog.clock_timestamp(), '2011-08-24T21:07:01.723Z'::timestamptz)",
    );
    expect(sql).toContain(`shardctl next_id v${ID_FUNCTION_VERSION}:`);
  });

  it("locks next_id's slow path with one of the control schema's lock tables (the id_locks row too while changing over), never an advisory lock", () => {
    const final = renderNextIdControlSql(DEFAULT_ID_LAYOUT, 'insta');
    const changing = renderNextIdControlSql(DEFAULT_ID_LAYOUT, 'insta', ID_LOCKS_SCHEMA, { changingOver: true });
    for (const sql of [final, changing]) {
      expect(sql).not.toMatch(/pg_advisory/);
      // One branch per lock table, each slot's own.
      const branches = [
        ...sql.matchAll(/(?:WHEN (\d+) THEN|ELSE) LOCK TABLE ONLY "shardctl"\.id_lock_(\d+) IN EXCLUSIVE MODE;/g),
      ];
      expect(branches.map((b) => Number(b[2]))).toEqual(Array.from({ length: ID_LOCK_TABLES }, (_, i) => i));
      expect(branches.slice(0, -1).every((b) => b[1] === b[2])).toBe(true);
      expect(branches.at(-1)![1]).toBeUndefined();
      expect(sql).toContain(`CASE (seq::oid::bigint % ${ID_LOCK_TABLES})::integer`);
      expect(sql).toContain(
        'PERFORM FROM "shardctl".id_locks WHERE slot = (seq::oid::bigint % 8192)::integer FOR NO KEY UPDATE;',
      );
    }
    expect(final).toContain('IF 0 = 1 THEN');
    expect(final).toContain(`IS '${SLOW_PATH_COMMENT}';`);
    expect(changing).toContain('IF 1 = 1 THEN');
    expect(changing).toContain(`IS '${SLOW_PATH_CHANGING_COMMENT}';`);
    expect(CONTROL_SCHEMA).toBe(ID_LOCKS_SCHEMA);
  });

  it("next_id()'s one condition accepts exactly the positions next_id_fast() accepts, and any other position it lets through overflows bigint", () => {
    // Both conditions as PostgreSQL evaluates them (int8 shifts wrap, timestamps in whole µs),
    // with the constants of the default layout; A is the fast path's accept-before instant.
    const layout = DEFAULT_ID_LAYOUT;
    const A = (layout.epochMs + 2n) * 1000n; // µs since the Unix epoch: epoch + lag (1 ms) + 1 ms
    const max = (1n << 50n) - 1n;
    const k = (1n << 23n) - (1n << 10n);
    const inline = (p: bigint, clockUs: bigint) => {
      const m = BigInt.asIntN(64, p << 13n) >> 23n;
      return A + m * 1000n > (clockUs > A ? clockUs : A);
    };
    const fast = (p: bigint, clockUs: bigint) => p >= 1024n && p <= max && clockUs < A + (p >> 10n) * 1000n;
    const idOverflows = (p: bigint) => {
      const product = (p >> 10n) * k;
      const inRange = (x: bigint) => x >= -(1n << 63n) && x < 1n << 63n;
      return !inRange(product) || !inRange(p + product) || !inRange(p + product + 5120n);
    };
    const nowUs = BigInt(Date.UTC(2026, 10, 22)) * 1000n;
    const position = fc.oneof(
      fc.bigInt({ min: 0n, max }),
      // Around the clock: the positions that matter, at every offset within a few ms.
      fc.bigInt({ min: -5000n, max: 5000n }).map((d) => ((nowUs / 1000n - layout.epochMs) << 10n) + d),
      fc.bigInt({ min: 0n, max: 2048n }),
      fc.bigInt({ min: max - 2048n, max: max + 2048n }),
      fc.bigInt({ min: -(1n << 63n), max: (1n << 63n) - 1n }),
    );
    const clock = fc.oneof(
      fc.bigInt({ min: nowUs - 10_000n, max: nowUs + 10_000n }),
      fc.bigInt({ min: A - 5000n, max: A + 5000n }),
      fc.bigInt({ min: 0n, max: A }),
    );
    fc.assert(
      fc.property(position, clock, (p, clockUs) => {
        if (p >= 0n && p <= max) expect(inline(p, clockUs)).toBe(fast(p, clockUs));
        else if (inline(p, clockUs)) expect(idOverflows(p)).toBe(true);
      }),
      { numRuns: 20_000 },
    );
  });

  it('quotes identifiers and literals, so a value cannot end the quoting', () => {
    expect(quoteIdent('a"b')).toBe('"a""b"');
    expect(quoteLiteral("it's")).toBe("'it''s'");
    expect(quoteLiteral('a\\b')).toBe("E'a\\\\b'");
    expect(renderSql('select {{x}}, {{y}}', { x: { literal: "'; drop table t; --" }, y: { int: 5n } })).toBe(
      "select '''; drop table t; --', 5",
    );
  });

  it('refuses placeholders without values, values without placeholders, and unsafe numbers', () => {
    expect(() => renderSql('select {{x}}', {})).toThrow(/\{\{x\}\} has no value/);
    expect(() => renderSql('select 1', { x: { int: 1 } })).toThrow(/no placeholder \{\{x\}\}/);
    expect(() => renderSql('select {{x}}', { x: { int: 2 ** 60 } })).toThrow(/not a safe integer/);
  });
});

describe('redact', () => {
  it('removes passwords from URLs and keyword connection strings', () => {
    expect(redact('cannot reach postgres://app:s3cret@db1:5432/app now')).toBe(
      'cannot reach postgres://app:***@db1:5432/app now',
    );
    expect(redact('host=db1 password=s3cret user=app')).toBe('host=db1 password=*** user=app');
    expect(redactUrl('postgresql://u:p%40ss@h/db')).toBe('postgresql://u:***@h/db');
  });

  it('hides the whole password when it holds an unencoded @', () => {
    expect(redact('psql postgres://u:TopSecret@TopSecretTail99@127.0.0.1:5902/app')).toBe(
      'psql postgres://u:***@127.0.0.1:5902/app',
    );
    expect(redactUrl('postgres://u:TopSecret@TopSecretTail99@127.0.0.1:5902/app')).toBe(
      'postgres://u:***@127.0.0.1:5902/app',
    );
  });

  it('never shows any part of a URL password, whatever characters it holds', () => {
    const password = fc.string({
      unit: fc.constantFrom(..."aZ9@:/?#%&=+!$*()[]{}'~^|<>,.;-_"),
      minLength: 4,
      maxLength: 24,
    });
    fc.assert(
      fc.property(password, (pw) => {
        expect(redact(`error at postgres://app:${pw}@db1:5432/app: timeout`)).toBe(
          'error at postgres://app:***@db1:5432/app: timeout',
        );
        expect(redactUrl(`postgres://app:${pw}@db1:5432/app`)).toBe('postgres://app:***@db1:5432/app');
      }),
    );
  });

  it('masks a registered password wherever it appears, e.g. inside a server error', () => {
    registerSecret('hunter2-very-secret');
    expect(redact('FATAL: role "x" does not exist (tried hunter2-very-secret)')).not.toContain('hunter2-very-secret');
  });

  it('hides a password given as a query keyword, its name percent-encoded or not', () => {
    for (const url of [
      'postgres://u@h:5432/db?pass%77ord=Kw9-qP2x&sslmode=disable',
      'postgres://u@h/db?sslmode=disable&PASSWORD=Kw9-qP2x',
      'postgres://u@h/db?%73slpassword=Kw9-qP2x',
    ]) {
      expect(redactUrl(url)).not.toContain('Kw9-qP2x');
      expect(redact(`"${url}" is not a valid URL`)).not.toContain('Kw9-qP2x');
    }
    expect(redactUrl('postgres://u@h/db?password=x')).toBe('postgres://u@h/db?password=***');
    registerUrlSecret('postgres://u@h/db?pass%77ord=Zq7%21-registered');
    expect(redact('tried Zq7!-registered and Zq7%21-registered')).toBe('tried *** and ***');
  });

  it('masks on its own only a distinctive password: a common word or a short one stays where it is ordinary text', () => {
    registerSecret('shard');
    registerSecret('postgres');
    registerSecret('s3cr');
    expect(redact('exec: 2 shards; postgres://127.0.0.1:5432/postgres; s3cr')).toBe(
      'exec: 2 shards; postgres://127.0.0.1:5432/postgres; s3cr',
    );
    // Where it stands as a password, it is hidden all the same.
    expect(redact('postgres://postgres:postgres@h/db password=shard')).toBe(
      'postgres://postgres:***@h/db password=***',
    );
  });

  it('redactedJson masks before escaping: valid JSON whatever the password holds, bigints as decimal strings', () => {
    registerSecret('"p\\a:ss1"}');
    const text = redactedJson({ message: 'tried "p\\a:ss1"} here', id: 2n ** 62n, rows: [{ note: 'fine' }] });
    expect(JSON.parse(text)).toEqual({
      message: 'tried *** here',
      id: '4611686018427387904',
      rows: [{ note: 'fine' }],
    });
  });
});

describe('the sql tag (src/pg/sql-template.ts)', () => {
  it('quotes names and literals, checks integers once, and takes only SQL text as a value', () => {
    expect(sql`DROP TRIGGER ${ident('a"b')} ON ${ident('insta1', 'photo likes')} -- ${lit("it's")}`).toBe(
      `DROP TRIGGER "a""b" ON "insta1"."photo likes" -- 'it''s'`,
    );
    expect(sql`WHERE shard IN (${list([int(1), int(2n)])})`).toBe('WHERE shard IN (1, 2)');
    expect(() => int(1.5, 'a wave')).toThrow('not a wave: 1.5');
    expect(() => int(-1, 'a shard number')).toThrow('not a shard number: -1');
    expect(int(-1, 'a wave', -1)).toBe('-1');
    expect(() => int(2 ** 53, 'an OID')).toThrow('not an OID');
    expect(lockWait(0)).toBe("'1ms'");
    expect(lockWait(249.6)).toBe("'250ms'");
    // A plain value gets past the type checker only by a cast; the tag refuses it still.
    expect(() => sql`SELECT ${5 as unknown as Sql}`).toThrow('value 1 is a number');
  });
});

describe('one text for each rule the SQL of moves and of the control schema share', () => {
  it("sql/control.sql's shard_fenced() and shard_moved() raise SC100 with the text of shardMovedRaiseSql", () => {
    const file = readFileSync(join(import.meta.dirname, '..', '..', 'sql', 'control.sql'), 'utf8');
    expect(file).toContain(shardMovedRaiseSql(sql`TG_ARGV[0]`, sql`TG_ARGV[1]`, 'writes to this copy are refused', 2));
    expect(file).toContain(shardMovedRaiseSql(sql`shard`, sql`host`, 'this is its old copy', 2));
    expect(fenceGuardSql('m1', 0)).toContain(
      shardMovedRaiseSql(sql`TG_ARGV[0]`, sql`TG_ARGV[1]`, 'writes to this copy are refused', 4),
    );
  });

  it("a fence runs by name the sequences' read prepared before it, the same read it would run inline", () => {
    for (const sequenceData of [false, true]) {
      const reads = { sequences: [['insta1', 'photos_id_seq'] as const], sequenceData, shards: [1] };
      const inline = fenceReadsSql(reads)[0]!;
      const prepared = prepareSequencesReadSql('shardctl_fence_sequences_7', reads);
      expect(prepared).toBe(
        `PREPARE "shardctl_fence_sequences_7" AS ${inline.slice(0, -1)};\nEXECUTE "shardctl_fence_sequences_7";`,
      );
      expect(fenceReadsSql({ ...reads, prepared: 'shardctl_fence_sequences_7' }).slice(0, 2)).toEqual([
        'EXECUTE "shardctl_fence_sequences_7";',
        'DEALLOCATE "shardctl_fence_sequences_7";',
      ]);
    }
  });

  it('a move reads the placement version a switch starts from with the same expression', () => {
    const expression = placementVersionSql(sql`shard IN (4, 5)`);
    expect(fenceReadsSql({ sequences: [], sequenceData: true, shards: [4, 5] }).join('\n')).toContain(expression);
    expect(switchPlacementSql(true)).toContain(placementVersionSql(sql`shard = ANY($1::int[])`, sql`$3::bigint - 1`));
  });
});
