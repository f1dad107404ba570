import { describe, expect, it } from 'vitest';
import { parsePublishedFunction, publishedLayoutProblems } from '../../src/adopt/published.js';
import { ADOPT_LEAD_MS, adoptedWrapperSql, switchShardSql } from '../../src/adopt/sql.js';
import type { ShardctlConfig } from '../../src/config/types.js';
import { DEFAULT_ID_LAYOUT } from '../../src/id/layout.js';
import { renderNextIdSql } from '../../src/id/sql.js';
import type { MigrationFile } from '../../src/migrations/files.js';
import { articleNextIdBody } from '../fixtures/article-next-id.js';

/** The article's function as published, with % for its %% misprint. */
const ARTICLE = `\n${articleNextIdBody('insta5', 5)}\n    `;

const config = { idLayout: DEFAULT_ID_LAYOUT, schemaPrefix: 'insta' } as unknown as ShardctlConfig;

describe('the published next_id()', () => {
  it('is recognised as published, its constants read from the body', () => {
    expect(parsePublishedFunction(ARTICLE)).toEqual({
      epochMs: 1314220021721n,
      shard: 5,
      sequenceText: 'insta5.table_id_seq',
      sequence: { schema: 'insta5', name: 'table_id_seq' },
      modulus: 1024n,
      timeShift: 23,
      shardShift: 10,
    });
  });

  it('is recognised whatever its case, spacing and comments', () => {
    const retyped = ARTICLE.toLowerCase()
      .replace(/\n\s*/g, '\n  ')
      .replace('begin', '-- the ids\nbegin /* as published */');
    expect(parsePublishedFunction(retyped)?.shard).toBe(5);
  });

  it.each([
    ['the misprint %% (an operator that does not exist: every call fails)', ARTICLE.replace('% 1024', '%% 1024')],
    ['a body that reads the sequence without the clock', "BEGIN result := nextval('insta5.table_id_seq'); END;"],
    ['one more statement', ARTICLE.replace('END;', 'PERFORM pg_sleep(0);\nEND;')],
    [
      'the parts in another order',
      ARTICLE.replace(
        'result := result | (shard_id << 10);\n    result := result | (seq_id);',
        'result := result | (seq_id);\n    result := result | (shard_id << 10);',
      ),
    ],
  ])('is not recognised with %s', (_, body) => {
    expect(parsePublishedFunction(body)).toBeNull();
  });

  it('agrees with the default layout for its own schema', () => {
    expect(publishedLayoutProblems(parsePublishedFunction(ARTICLE)!, DEFAULT_ID_LAYOUT, 5, 'insta5')).toEqual([]);
  });

  it('names each constant that disagrees with the config, with both values', () => {
    const fn = parsePublishedFunction(
      ARTICLE.replace('1314220021721', '1420070400000').replace('% 1024', '% 4096').replace("'insta5.", "'insta6."),
    )!;
    const problems = publishedLayoutProblems(fn, DEFAULT_ID_LAYOUT, 7, 'insta7');
    expect(problems).toEqual([
      "its epoch is 1420070400000 ms (2015-01-01T00:00:00.000Z), the config's idLayout.epoch is 1314220021721 ms (2011-08-24T21:07:01.721Z)",
      "it keeps nextval() % 4096 and shifts the shard by 10; the config's idLayout.sequenceBits 10 means % 1024 and << 10",
      'its shard_id is 5, but the schema insta7 is shard 7',
      'it draws from insta6.table_id_seq, a sequence outside its schema insta7',
    ]);
  });
});

describe('the switch of one shard', () => {
  const baseline = [{ version: 1, name: '0001_article', checksum: 'abc' }] as MigrationFile[];
  const sql = switchShardSql(config, {
    shard: 5,
    schema: 'insta5',
    sequence: 'table_id_seq',
    tables: [
      { table: 'photos', column: 'id' },
      { table: 'likes', column: 'id' },
    ],
    baseline,
    lockTimeout: '5s',
  });

  it('is one transaction: the sequence locked, moved forward, the functions replaced, the shard and its baseline recorded, in that order', () => {
    const order = [
      'BEGIN;',
      `SET LOCAL lock_timeout = '5s';`,
      'ALTER SEQUENCE "insta5"."table_id_seq" CACHE 1;',
      `SELECT pg_catalog.setval('"insta5"."table_id_seq"'::regclass, GREATEST(`,
      'CREATE OR REPLACE FUNCTION "insta5".next_id(seq regclass)',
      'CREATE OR REPLACE FUNCTION "insta5".next_id(OUT result bigint)',
      `INSERT INTO "shardctl".shards (shard, schema_name) VALUES (5, 'insta5') ON CONFLICT (shard) DO NOTHING;`,
      `INSERT INTO "shardctl".migrations (shard, version, name, checksum) VALUES (5, 1, '0001_article', 'abc') ON CONFLICT (shard, version) DO NOTHING;`,
      'COMMIT;',
    ].map((part) => sql.indexOf(part));
    expect(order.every((at) => at >= 0)).toBe(true);
    expect([...order].sort((a, b) => a - b)).toEqual(order);
  });

  it("installs shardctl's next_id exactly as renderNextIdSql renders it", () => {
    expect(sql).toContain(renderNextIdSql('insta5', 5, DEFAULT_ID_LAYOUT).trim());
  });

  it('moves the sequence above the position of every stored id, above the clock plus the lead, and never back', () => {
    expect(sql).toContain('SELECT ((max("id") >> 23) << 10) | (max("id") & 1023) AS pos FROM "insta5"."photos"');
    expect(sql).toContain(
      'UNION ALL SELECT ((max("id") >> 23) << 10) | (max("id") & 1023) AS pos FROM "insta5"."likes"',
    );
    expect(sql).toContain(`::bigint - 1314220021721 + ${ADOPT_LEAD_MS}) << 10,`);
    expect(sql).toContain('(SELECT last_value + 1 FROM "insta5"."table_id_seq")');
  });

  it('keeps the published signature and language for the wrapper, and quotes every name', () => {
    const wrapper = adoptedWrapperSql('we"ird', 'table_id_seq');
    expect(wrapper).toContain('CREATE OR REPLACE FUNCTION "we""ird".next_id(OUT result bigint)\nLANGUAGE plpgsql');
    expect(wrapper).toContain(`result := "we""ird".next_id('"we""ird"."table_id_seq"'::regclass);`);
  });
});
