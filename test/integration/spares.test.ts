import type pg from 'pg';
import { describe, expect, it } from 'vitest';
import { init } from '../../src/index.js';
import { CREATE_WORKER, Spares } from '../../src/moves/workers.js';
import { makeFleet } from '../helpers/fleet.js';
import { useTestDatabases, withClient } from '../helpers/hosts.js';
import { startTcpProxy } from '../helpers/tcp-proxy.js';

// A move's worker connections opened ahead (workers.ts): the creation's while the preflight runs,
// the clean-up's during the last wave's cut-over. What a step takes must be a connection that works.
describe('spare worker connections', () => {
  const db = useTestDatabases(1);

  it('are recorded as workers, handed out once each, replaced when the server ended one meanwhile, and closed when not taken', async () => {
    const fleet = makeFleet({ urls: db.urls, shards: 2, schemaPrefix: 'sp' });
    const config = await fleet.config();
    expect((await init(config)).ok).toBe(true);
    const host = config.hosts[0]!;
    const spares = new Spares();
    spares.open(host, CREATE_WORKER, 3);
    const pidOf = async (client: pg.Client) =>
      Number((await client.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid);

    const first = await spares.take(host, CREATE_WORKER);
    const firstPid = await pidOf(first);
    const waiting = await withClient(db.urls[0]!, async (admin) => {
      // Every spare connected and recorded as a worker before any work.
      for (let i = 0; i < 100; i++) {
        const n = await admin.query(
          `SELECT count(*)::int AS n FROM shardctl.workers w JOIN pg_stat_activity a ON a.pid = w.pid
            WHERE a.application_name = $1 AND a.datname = current_database()`,
          [CREATE_WORKER],
        );
        if (n.rows[0].n === 3) break;
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
      const others = await admin.query<{ pid: number }>(
        'SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database() AND pid <> $2 ORDER BY pid',
        [CREATE_WORKER, firstPid],
      );
      expect(others.rows).toHaveLength(2);
      // The server ends one of the waiting spares (idle_session_timeout, an administrator).
      await admin.query('SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE pid = ANY($1)', [
        others.rows.map((r) => r.pid),
      ]);
      return others.rows.map((r) => Number(r.pid));
    });

    // Both waiting spares were ended: each take gets a new connection that answers.
    const second = await spares.take(host, CREATE_WORKER);
    const third = await spares.take(host, CREATE_WORKER);
    const taken = [firstPid, await pidOf(second), await pidOf(third)];
    expect(new Set(taken).size).toBe(3);
    for (const pid of taken.slice(1)) expect(waiting).not.toContain(pid);
    // None left: a fourth is a new connection too.
    const fourth = await spares.take(host, CREATE_WORKER);
    expect(await pidOf(fourth)).not.toBe(firstPid);
    await Promise.all([first, second, third, fourth].map((c) => c.end()));

    // Spares never taken are closed with the move.
    const left = new Spares();
    left.open(host, CREATE_WORKER, 2);
    await new Promise((resolve) => setTimeout(resolve, 300));
    await left.close();
    await withClient(db.urls[0]!, async (admin) => {
      for (let i = 0; i < 100; i++) {
        const n = await admin.query(
          'SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()',
          [CREATE_WORKER],
        );
        if (n.rows[0].n === 0) return;
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
      throw new Error('spares left open after close()');
    });
  });

  it('still connecting to a host that stopped answering are ended when closed, not waited for until the host timeout', async () => {
    const fleet = makeFleet({ urls: db.urls, shards: 2, schemaPrefix: 'sq' });
    const config = await fleet.config();
    // The host accepts connections and then says nothing (a hung server, a black-holed route).
    // Silent from the start (connecting), or once each connection has started (recording itself as a worker).
    for (const mode of ['all', 'after-handshake'] as const) {
      const proxy = await startTcpProxy(db.urls[0]!);
      try {
        proxy.silence(mode);
        const timeoutMs = 20_000;
        const host = { ...config.hosts[0]!, url: proxy.url, timeoutMs };
        const spares = new Spares();
        spares.open(host, CREATE_WORKER, 2);
        await new Promise((resolve) => setTimeout(resolve, 300));
        let timer: NodeJS.Timeout | undefined;
        const closed = await Promise.race([
          spares.close().then(() => 'closed'),
          new Promise((resolve) => (timer = setTimeout(() => resolve('still waiting'), timeoutMs / 4))),
        ]);
        clearTimeout(timer);
        expect({ mode, closed }).toEqual({ mode, closed: 'closed' });
      } finally {
        await proxy.close();
      }
    }
  });
});
