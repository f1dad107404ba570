import { createRequire } from 'node:module';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import pg from 'pg';
import { checkPgInternals, statementMessages, TransactionStart } from '../../src/router/begin.js';

// pg's own serializer (pg-protocol, pg's dependency): the bytes pg would write for the same messages.
const { serialize } = createRequire(import.meta.url)('pg-protocol') as {
  serialize: { parse(q: { text: string }): Buffer; bind(c: object): Buffer; execute(c: object): Buffer };
};
const pgWrites = (text: string): Buffer =>
  Buffer.concat([serialize.parse({ text }), serialize.bind({}), serialize.execute({})]);

describe('statementMessages (BEGIN, SET LOCAL and COMMIT sent with fn’s query)', () => {
  it('is byte for byte what pg writes for Parse/Bind/Execute of the same text', () => {
    for (const text of [
      'BEGIN',
      'BEGIN READ ONLY',
      'COMMIT',
      'SET LOCAL search_path TO "insta5", pg_temp',
      'SET LOCAL search_path TO "ünï ""q"""',
    ]) {
      expect(statementMessages(text).equals(pgWrites(text))).toBe(true);
    }
    fc.assert(
      fc.property(
        fc.string({ unit: 'grapheme', minLength: 1 }).filter((t) => !t.includes('\0')),
        (text) => {
          expect(statementMessages(text).toString('hex')).toBe(pgWrites(text).toString('hex'));
        },
      ),
    );
  });

  it('TransactionStart: the statements as one text, and their messages in order', () => {
    const start = new TransactionStart(['BEGIN READ ONLY', 'SET LOCAL search_path TO "insta7"']);
    expect(start.text).toBe('BEGIN READ ONLY; SET LOCAL search_path TO "insta7"');
    expect(start.statements).toBe(2);
    expect(
      start.messages.equals(
        Buffer.concat([pgWrites('BEGIN READ ONLY'), pgWrites('SET LOCAL search_path TO "insta7"')]),
      ),
    ).toBe(true);
    // Nothing open-only: a one-trip transaction sends the same.
    expect(start.oneTrip).toEqual({ messages: start.messages, statements: 2 });
  });

  it('TransactionStart.oneTrip leaves out the open-only statements (the idle timeout), in order otherwise', () => {
    const start = new TransactionStart([
      'BEGIN',
      'SET LOCAL search_path TO "insta7"',
      { sql: 'SET LOCAL idle_in_transaction_session_timeout = 5000', openOnly: true },
      'SELECT 1 WHERE false',
    ]);
    expect(start.statements).toBe(4);
    expect(start.text).toBe(
      'BEGIN; SET LOCAL search_path TO "insta7"; SET LOCAL idle_in_transaction_session_timeout = 5000; SELECT 1 WHERE false',
    );
    expect(start.oneTrip.statements).toBe(3);
    expect(
      start.oneTrip.messages.equals(
        Buffer.concat([
          pgWrites('BEGIN'),
          pgWrites('SET LOCAL search_path TO "insta7"'),
          pgWrites('SELECT 1 WHERE false'),
        ]),
      ),
    ).toBe(true);
  });
});

describe('the pg internals FirstQuery relies on', () => {
  it('are present in the installed pg', () => {
    expect(checkPgInternals()).toEqual({ ok: true });
  });

  it('are refused, naming what is missing, when a release drops one or its major is not the tested one', () => {
    class Partial {
      submit(): void {}
      handleCommandComplete(): void {}
    }
    expect(checkPgInternals(Partial, '8.23.1')).toEqual({
      ok: false,
      reason: "pg's Query has no _getRows, handleEmptyQuery, handleDataRow, handleReadyForQuery",
    });
    expect(checkPgInternals(pg.Query, '8.23.1', class {})).toEqual({
      ok: false,
      reason: "pg's Connection has no _send",
    });
    expect(checkPgInternals(pg.Query, '9.0.0')).toEqual({
      ok: false,
      reason: 'pg 9.0.0 is outside the tested range 8.x (tested with 8.23)',
    });
  });
});
