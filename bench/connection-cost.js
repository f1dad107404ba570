/**
 * connection-cost: what one database connection holds after it has served many shards (issue 39).
 *
 * A fleet of N shards on one host (the example migrations: photos, likes, comments). One
 * connection inserts one row into photos of every shard as the router does (`BEGIN; SET LOCAL
 * search_path; INSERT; COMMIT`): each shard's first insert draws a fresh sequence, so it takes
 * next_id's slow path. Then the same connection reads its own memory contexts
 * (`pg_backend_memory_contexts`, PostgreSQL 14 and later): the bytes it holds, the cached plan
 * sources and plans, and the PL/pgSQL function caches. N from --conn-shards (64, 512, 2048 by
 * default, each a fleet of its own). Targets at 512 shards: ≤ 24 MB and ≤ 2,000 cached plan sources.
 */
import pg from 'pg';
import { initFleet, itemAt, log, markdownTable, required, round, textTable, verdict } from './lib.js';

export const description = "one connection's memory and cached plans after inserting into every shard of a host";

const TARGET_BYTES = 24 * 1024 * 1024;
const TARGET_PLAN_SOURCES = 2000;
const TARGET_AT = 512;

const CONTEXTS_SQL = `
  SELECT sum(total_bytes)::bigint AS bytes,
         count(*) FILTER (WHERE name = 'CachedPlanSource')::int AS plan_sources,
         count(*) FILTER (WHERE name = 'CachedPlan')::int AS plans,
         count(*) FILTER (WHERE name = 'PL/pgSQL function')::int AS plpgsql
    FROM pg_backend_memory_contexts`;

/**
 * The connection's memory contexts: bytes, cached plans and PL/pgSQL functions.
 * @param {pg.Client} client
 */
async function contexts(client) {
  const row = required((await client.query(CONTEXTS_SQL)).rows[0], 'row of pg_backend_memory_contexts');
  return { bytes: Number(row.bytes), planSources: row.plan_sources, plans: row.plans, plpgsql: row.plpgsql };
}

/** @typedef {Awaited<ReturnType<typeof run>>} Result */

/**
 * @param {import('./run.js').BenchContext} ctx
 * @param {string} major
 */
export async function run(ctx, major) {
  const counts = ctx.options.connShards;
  /**
   * @type {{
   *   shards: number,
   *   before: Awaited<ReturnType<typeof contexts>>,
   *   after: Awaited<ReturnType<typeof contexts>>,
   *   perShardBytes: number,
   *   insertMs: number,
   * }[]}
   */
  const rows = [];
  let serverVersion = '';
  for (const shards of counts) {
    const fleet = await ctx.fleet(`conn-${shards}`, major, {
      database: `bench_conn_${shards}`,
      hostCount: 1,
      shards,
    });
    const host = itemAt(fleet.hosts, 0);
    serverVersion = await host.serverVersion();
    log(`connection-cost on PostgreSQL ${serverVersion}: init of ${shards} shards on one host (untimed)`);
    await initFleet(fleet);
    const client = new pg.Client({ connectionString: host.url(fleet.database) });
    await client.connect();
    try {
      const before = await contexts(client);
      const started = performance.now();
      for (let shard = 0; shard < shards; shard++) {
        await client.query(
          `BEGIN; SET LOCAL search_path TO insta${shard}; INSERT INTO photos (user_id, image_url) VALUES (${shard}, 'x'); COMMIT`,
        );
      }
      const elapsedMs = performance.now() - started;
      const after = await contexts(client);
      const perShardBytes = (after.bytes - before.bytes) / shards;
      rows.push({ shards, before, after, perShardBytes, insertMs: elapsedMs });
      log(
        `  ${shards} shards: ${round(after.bytes / 2 ** 20)} MB (${round(perShardBytes / 1024)} KB a shard), ${after.planSources} plan sources, ${after.plpgsql} PL/pgSQL functions`,
      );
    } finally {
      await client.end();
    }
  }
  const at = rows.find((r) => r.shards === TARGET_AT);
  return {
    benchmark: 'connection-cost',
    major,
    serverVersion,
    rows,
    target: at
      ? {
          at: TARGET_AT,
          bytes: at.after.bytes,
          planSources: at.after.planSources,
          pass: at.after.bytes <= TARGET_BYTES && at.after.planSources <= TARGET_PLAN_SOURCES,
        }
      : null,
  };
}

/** @param {Result} result */
function tableRows(result) {
  return result.rows.map((r) => [
    String(r.shards),
    `${round(r.before.bytes / 2 ** 20)} MB`,
    `${round(r.after.bytes / 2 ** 20)} MB`,
    `${round(r.perShardBytes / 1024)} KB`,
    String(r.after.planSources),
    String(r.after.plans),
    String(r.after.plpgsql),
  ]);
}

const HEADERS = [
  'shards touched',
  'fresh connection',
  'after',
  'per shard',
  'CachedPlanSource',
  'CachedPlan',
  'PL/pgSQL functions',
];

/** @param {Result} result */
export function table(result) {
  const target = result.target
    ? `\ntarget at ${TARGET_AT} shards (≤ 24 MB, ≤ ${TARGET_PLAN_SOURCES} plan sources): ${verdict(result.target.pass)}`
    : '';
  return `connection-cost, PostgreSQL ${result.serverVersion}\n${textTable(HEADERS, tableRows(result))}${target}`;
}

/** @param {Result[]} results */
export function markdown(results) {
  return results
    .map(
      (result) =>
        `PostgreSQL ${result.serverVersion}:\n\n${markdownTable(HEADERS, tableRows(result))}${
          result.target ? `\n\nTarget at ${TARGET_AT} shards: ${verdict(result.target.pass)}` : ''
        }`,
    )
    .join('\n\n');
}
