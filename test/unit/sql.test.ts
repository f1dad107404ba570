import { describe, expect, it } from 'vitest';
import { DEFAULT_ID_LAYOUT } from '../../src/id/layout.js';
import { renderNextIdSql } from '../../src/id/sql.js';
import { quoteIdent, quoteLiteral } from '../../src/pg/quote.js';
import { redact, redactUrl, registerSecret } from '../../src/pg/redact.js';
import { renderSql } from '../../src/pg/template.js';

describe('SQL templates', () => {
  it('fills next_id with bigint-safe constants: the shard in its own bits, shifts on bigint values', () => {
    const sql = renderNextIdSql('insta5', 5, DEFAULT_ID_LAYOUT);
    expect(sql).toContain('CREATE OR REPLACE FUNCTION "insta5".next_id(seq regclass)');
    // ((pos >> 10) << 23) | (5 << 10) | (pos & 1023), written as pos + (pos >> 10) * (2^23 - 2^10) + (5 << 10).
    expect(sql).toContain('THEN pos + (pos >> 10) * 8387584 + 5120');
    expect(sql).toContain('RETURN pos + (pos >> 10) * 8387584 + 5120;');
    expect(sql).toContain('AND pos <= 1125899906842623'); // 2^50 - 1: 40 time bits + 10 sequence bits
    expect(sql).not.toMatch(/\{\{\w+\}\}/);
  });

  it('makes next_id() one inlinable SQL expression that draws exactly one position and accepts exactly what next_id_fast() accepts', () => {
    const sql = renderNextIdSql('insta5', 5, DEFAULT_ID_LAYOUT);
    const nextId = sql.slice(sql.indexOf('CREATE OR REPLACE FUNCTION "insta5".next_id(seq regclass)'));
    expect(nextId).toContain('LANGUAGE sql VOLATILE');
    expect(nextId.match(/nextval\(/g)).toHaveLength(1);
    // The position is drawn by the first WHEN (CASE evaluates its conditions in order), and only
    // read back with currval() after it.
    expect(nextId).toMatch(/RETURN CASE\s+WHEN pg_catalog\.nextval\(seq\) < 1024 THEN "insta5"\.next_id_locked\(seq\)\s+WHEN pg_catalog\.currval/);
    // Accept while clock < epoch + ((pos >> 10) + 2) ms, i.e. pos >= (now_ms - 1) << 10.
    expect(sql).toContain("clock_timestamp() < '2011-08-24T21:07:01.723Z'::timestamptz + (pos >> 10) * interval '1 millisecond'");
    // next_id_fast()'s condition and id, with pos read back by currval(): the same positions, the
    // same ids. Its first conjunct (pos >= 1024) is the first WHEN, negated, in next_id().
    const fast = sql.slice(sql.indexOf('CREATE OR REPLACE FUNCTION "insta5".next_id_fast'), sql.indexOf('CREATE OR REPLACE FUNCTION "insta5".next_id(seq regclass)'));
    const [, condition, id] = /RETURN CASE\s+WHEN (.*?)\s+THEN (.*?)\s+ELSE "insta5"\.next_id_locked\(seq\)/s.exec(fast)!;
    const flat = (expr: string) => expr.replaceAll(/\s+/g, ' ');
    const inline = (expr: string) => flat(expr.replaceAll(/\bpos\b/g, 'pg_catalog.currval(seq)'));
    expect(flat(condition!).startsWith('pos >= 1024 AND ')).toBe(true);
    const rest = flat(condition!).slice('pos >= 1024 AND '.length);
    const body = /RETURN CASE\s+WHEN pg_catalog\.nextval\(seq\) < 1024 THEN "insta5"\.next_id_locked\(seq\)\s+WHEN (.*?)\s+THEN (.*?)\s+ELSE "insta5"\.next_id_locked\(seq\)\s+END;/s.exec(nextId)!;
    expect(flat(body[1]!)).toBe(inline(rest));
    expect(flat(body[2]!)).toBe(inline(id!));
    expect(sql).toContain('shardctl next_id v5:');
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
    expect(redact('cannot reach postgres://app:s3cret@db1:5432/app now')).toBe('cannot reach postgres://app:***@db1:5432/app now');
    expect(redact('host=db1 password=s3cret user=app')).toBe('host=db1 password=*** user=app');
    expect(redactUrl('postgresql://u:p%40ss@h/db')).toBe('postgresql://u:***@h/db');
  });

  it('masks a registered password wherever it appears, e.g. inside a server error', () => {
    registerSecret('hunter2-very-secret');
    expect(redact('FATAL: role "x" does not exist (tried hunter2-very-secret)')).not.toContain('hunter2-very-secret');
  });
});
