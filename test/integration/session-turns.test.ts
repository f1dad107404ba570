/**
 * One session shared by parts of a command that run at the same time (a move's creation, its copy
 * and its early subscription on the target's session): a transaction on it runs in one turn, so a
 * query another part queued meanwhile neither runs inside it nor meets it aborted (25P02).
 */
import type pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connectHost } from '../../src/fleet/connect.js';
import { runTransaction } from '../../src/pg/quiet.js';
import { inOneTurn } from '../../src/pg/serial.js';
import { bareHost, useTestDatabases } from '../helpers/hosts.js';

const db = useTestDatabases(1);

describe('a session shared by concurrent callers', () => {
  let client: pg.Client;
  beforeAll(async () => {
    client = await connectHost(bareHost('pg1', db.urls[0]!));
    await client.query('CREATE TABLE turns (n int)');
  });
  afterAll(async () => {
    await client.end();
  });

  it('a transaction that fails is rolled back before the query another caller queued behind it runs', async () => {
    const failing = runTransaction(client, 'BEGIN;\nINSERT INTO turns VALUES (1);\nSELECT 1/0;\nCOMMIT;');
    const queued = client.query<{ n: string }>('SELECT count(*)::text AS n FROM turns');
    await expect(failing).rejects.toMatchObject({ code: '22012' });
    expect((await queued).rows[0]!.n).toBe('0');
    // Without the turn (the plain query and its ROLLBACK sent apart), the queued query met the
    // aborted transaction: what a move's copy met behind its early subscription.
    const bare = client.query('BEGIN;\nSELECT 1/0;\nCOMMIT;').catch(() => client.query('ROLLBACK'));
    const behind = client.query('SELECT 1').catch((e: unknown) => (e as { code?: string }).code);
    await bare;
    expect(await behind).toBe('25P02');
  });

  it("a turn's own queries go at once, other callers' wait until it ends and never run inside its transaction", async () => {
    const order: string[] = [];
    let entered!: () => void;
    const inside = new Promise<void>((resolve) => (entered = resolve));
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    const turn = inOneTurn(client, async () => {
      await client.query('BEGIN');
      await client.query('INSERT INTO turns VALUES (2)');
      entered();
      await held;
      // Nested: the same turn, not a wait for itself.
      await inOneTurn(client, async () => {
        await client.query('INSERT INTO turns VALUES (3)');
      });
      await client.query('COMMIT');
      order.push('turn');
    });
    await inside;
    // Another caller's query, made while the turn holds its transaction open.
    const outsider = client
      .query<{ xid: string | null }>('SELECT pg_current_xact_id_if_assigned()::text AS xid')
      .then((r) => {
        order.push('outsider');
        return r.rows[0]!.xid;
      });
    await new Promise((resolve) => setTimeout(resolve, 50));
    release();
    await turn;
    expect(await outsider).toBeNull();
    expect(order).toEqual(['turn', 'outsider']);
    expect((await client.query<{ n: string }>('SELECT count(*)::text AS n FROM turns')).rows[0]!.n).toBe('2');
  });
});
