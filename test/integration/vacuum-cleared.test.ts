import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { vacuumCleared } from '../../src/moves/chunks.js';
import { useTestDatabases, withClient } from '../helpers/hosts.js';

const db = useTestDatabases(1);

/**
 * A resumed copy deletes the rows of the chunks it copies again, then vacuums (chunks.ts
 * vacuumCleared): while a snapshot older than the delete lives, VACUUM cannot remove them. It tries
 * again for a while, and says how many it left when that snapshot outlives its patience.
 */
describe('the vacuum of the rows a resumed copy deleted', () => {
  it('tries again until an older snapshot is gone; reports the rows it could not remove when it never goes', async () => {
    const holder = new pg.Client({ connectionString: db.urls[0]! });
    await holder.connect();
    try {
      await withClient(db.urls[0]!, async (c) => {
        await c.query(`create table public.cleared (id bigint primary key, v text);
                       insert into public.cleared select g, repeat('x', 50) from generate_series(1, 5000) g`);
        await holder.query('begin isolation level repeatable read; select 1');
        await c.query('delete from public.cleared where id <= 2000');
        // Held beyond the patience: the rows stay, and their count is returned.
        expect(await vacuumCleared(c, 'public.cleared', 300)).toEqual({ dead: 2000, vacuumed: true });
        // Let go while it tries: none left.
        setTimeout(() => void holder.query('commit'), 400);
        expect(await vacuumCleared(c, 'public.cleared', 10_000)).toEqual({ dead: 0, vacuumed: true });
        const vacuums = await c.query<{ n: string }>(
          `select vacuum_count::text as n from pg_stat_user_tables where relid = 'public.cleared'::regclass`,
        );
        expect(Number(vacuums.rows[0]!.n)).toBeGreaterThan(2);
        const live = await c.query<{ n: string }>('select count(*)::text as n from public.cleared');
        expect(live.rows[0]!.n).toBe('3000');
      });
    } finally {
      await holder.end();
    }
  });

  it('a role that may not vacuum the table is told so at once, not made to wait', async () => {
    await withClient(db.urls[0]!, async (c) => {
      await c.query(`create table public.not_mine (id bigint primary key, v text);
                     insert into public.not_mine select g, 'x' from generate_series(1, 3000) g;
                     delete from public.not_mine where id <= 1000;
                     drop role if exists vacuum_cleared_reader; create role vacuum_cleared_reader;
                     grant select on public.not_mine to vacuum_cleared_reader`);
      await c.query('set role vacuum_cleared_reader');
      const started = Date.now();
      expect(await vacuumCleared(c, 'public.not_mine', 10_000)).toEqual({ dead: 1000, vacuumed: false });
      expect(Date.now() - started).toBeLessThan(5_000);
      await c.query('reset role');
      expect(await vacuumCleared(c, 'public.not_mine', 10_000)).toEqual({ dead: 0, vacuumed: true });
      await c.query('drop table public.not_mine; drop role vacuum_cleared_reader');
    });
  });
});
