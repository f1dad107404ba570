import type pg from 'pg';

/** Reads and writes of one shard's tables since the host's statistics were last reset. */
export interface ShardActivity {
  readonly shard: number;
  /** Rows inserted, updated and deleted (n_tup_ins + n_tup_upd + n_tup_del). */
  readonly writes: bigint;
  /** Rows read by sequential scans and fetched through indexes (seq_tup_read + idx_tup_fetch). */
  readonly reads: bigint;
}

/**
 * What pg_stat_user_tables counted per shard schema of `shards` on this host, and when the
 * database's statistics were last reset (null: never). The server reports a session's counts when
 * its transaction ends (PostgreSQL 15+: within a second of an idle session), and they start at
 * zero on a shard's new host after a move.
 */
export async function readShardActivity(
  client: pg.ClientBase,
  prefix: string,
  shards: readonly number[],
): Promise<{ shards: ShardActivity[]; statsReset: Date | null }> {
  const result = await client.query<{ nspname: string; writes: string; reads: string }>(
    `SELECT n.nspname,
            coalesce(sum(s.n_tup_ins + s.n_tup_upd + s.n_tup_del), 0)::text AS writes,
            coalesce(sum(s.seq_tup_read + coalesce(s.idx_tup_fetch, 0)), 0)::text AS reads
       FROM pg_catalog.pg_namespace n
       LEFT JOIN pg_catalog.pg_stat_user_tables s ON s.schemaname = n.nspname
      WHERE n.nspname = ANY($1::text[])
      GROUP BY n.nspname`,
    [shards.map((s) => `${prefix}${s}`)],
  );
  const reset = await client.query<{ stats_reset: Date | null }>(
    `SELECT stats_reset FROM pg_catalog.pg_stat_database WHERE datname = current_database()`,
  );
  return {
    shards: result.rows.map((r) => ({
      shard: Number(r.nspname.slice(prefix.length)),
      writes: BigInt(r.writes),
      reads: BigInt(r.reads),
    })),
    statsReset: reset.rows[0]?.stats_reset ?? null,
  };
}
