import { chmodSync, existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config/load.js';
import { init } from '../../src/commands/init.js';
import { psqlInvocation } from '../../src/commands/psql.js';
import { makeFleet, runCli, type Fleet } from '../helpers/fleet.js';
import { useTestDatabases, withClient } from '../helpers/hosts.js';
import { tempDir } from '../helpers/temp.js';

const db = useTestDatabases(2);

const MIGRATIONS = {
  '0001_photos.sql': `CREATE SEQUENCE photos_id_seq;
CREATE TABLE photos (id bigint PRIMARY KEY DEFAULT next_id('photos_id_seq'), user_id bigint NOT NULL, caption text, likes int, public boolean);
ALTER SEQUENCE photos_id_seq OWNED BY photos.id;`,
};

let fleet: Fleet;
/** A photo in shard 5 (on pg2), for --id. */
let photoId: string;

beforeAll(async () => {
  fleet = makeFleet({ urls: db.urls, shards: 8, split: ['0-3', '4-7'], schemaPrefix: 'ex', migrations: MIGRATIONS });
  expect((await init(await fleet.config())).ok).toBe(true);
  await withClient(db.urls[0]!, (c) =>
    c.query(
      `insert into ex1.photos (user_id, caption, likes, public) values (9, 'comma, "quoted"', 3, true), (17, null, 0, false)`,
    ),
  );
  await withClient(db.urls[1]!, async (c) => {
    const r = await c.query<{ id: string }>(
      `insert into ex5.photos (user_id, caption, likes, public) values (13, 'five', 1, true) returning id`,
    );
    photoId = r.rows[0]!.id;
  });
});

describe('shardctl exec', () => {
  it('prints a table with a leading shard column on every shard', async () => {
    const run = await runCli(['exec', '-c', fleet.configFile, 'select count(*) as n from photos']);
    expect(run.code).toBe(0);
    expect(run.stdout).toBe(
      [
        'shard | n',
        '------+--',
        '    0 | 0',
        '    1 | 2',
        '    2 | 0',
        '    3 | 0',
        '    4 | 0',
        '    5 | 1',
        '    6 | 0',
        '    7 | 0',
        '(8 rows)',
        '',
      ].join('\n'),
    );
    expect(run.stderr).toMatch(/exec: 8 shards, 8 rows, 0 failed/);
  });

  it('--statement-timeout cancels each shard past it and names those shards as failed (exit 1); a bad duration is exit 2', async () => {
    const run = await runCli([
      'exec',
      '-c',
      fleet.configFile,
      '--shards',
      '1,5',
      '--statement-timeout',
      '200ms',
      'select 1 as one from pg_sleep(case when current_schema() = $$ex5$$ then 3 else 0 end)',
    ]);
    expect(run.code).toBe(1);
    expect(run.stdout).toMatch(/^shard \| one\n-+\+-+\n +1 \| +1\n\(1 row\)\n$/);
    expect(run.stderr).toMatch(/shard 5 on \w+: canceling statement due to statement timeout \(SQLSTATE 57014\)/);
    expect(run.stderr).toMatch(/exec: 2 shards, 1 row, 1 failed/);
    for (const bad of ['5', '0ms', 'soon']) {
      const refused = await runCli(['exec', '-c', fleet.configFile, '--statement-timeout', bad, 'select 1']);
      expect(refused.code).toBe(2);
      expect(refused.stderr).toContain(
        `option --statement-timeout ${JSON.stringify(bad)}: expected a duration from 1ms to 1440min, like 500ms, 20s or 1min`,
      );
    }
  });

  it('prints JSON with bigints as decimal strings, and only the listed shards', async () => {
    const run = await runCli([
      'exec',
      '-c',
      fleet.configFile,
      '--shards',
      '5,1',
      '--json',
      'select id, user_id, caption, likes, public from photos order by id',
    ]);
    expect(run.code).toBe(0);
    const rows = JSON.parse(run.stdout) as Record<string, unknown>[];
    expect(rows.map((r) => [r['shard'], r['user_id'], r['caption'], r['likes'], r['public']])).toEqual([
      [1, '9', 'comma, "quoted"', 3, true],
      [1, '17', null, 0, false],
      [5, '13', 'five', 1, true],
    ]);
    expect(rows[2]!['id']).toBe(photoId);
  });

  it('prints CSV with a header and quoting', async () => {
    const run = await runCli([
      'exec',
      '-c',
      fleet.configFile,
      '--shards',
      '1',
      '--csv',
      'select user_id, caption, public from photos order by user_id',
    ]);
    expect(run.code).toBe(0);
    expect(run.stdout).toBe('shard,user_id,caption,public\n1,9,"comma, ""quoted""",t\n1,17,,f\n');
  });

  it('refuses a write without --write before running it, and writes with --write', async () => {
    const sql = `insert into photos (user_id, caption) values (1, 'from exec')`;
    const refused = await runCli(['exec', '-c', fleet.configFile, '--shards', '0-3', sql]);
    expect(refused.code).toBe(2);
    expect(refused.stderr).toContain('argument <sql>: the statement "insert into photos');
    expect(refused.stderr).toContain('INSERT is not a read');
    expect(refused.stderr).toContain('(writes need --write)');
    const count = () =>
      withClient(
        db.urls[0]!,
        async (c) =>
          (await c.query(`select count(*)::int as n from ex0.photos where caption = 'from exec'`)).rows[0]!.n as number,
      );
    expect(await count()).toBe(0);
    const written = await runCli([
      'exec',
      '-c',
      fleet.configFile,
      '--shards',
      '0',
      '--write',
      `${sql} returning user_id`,
    ]);
    expect(written.code).toBe(0);
    expect(written.stdout).toContain('    0 |       1');
    expect(await count()).toBe(1);
    // Dynamic DDL per shard, as a migration may run it: a DO block's EXECUTE (which the router
    // refuses an application) is the operator's to run with --write.
    const dynamic = await runCli([
      'exec',
      '-c',
      fleet.configFile,
      '--shards',
      '0',
      '--write',
      `DO $$ BEGIN EXECUTE format('COMMENT ON TABLE %I IS %L', 'photos', 'from exec'); END $$`,
    ]);
    expect(dynamic.code, dynamic.stderr).toBe(0);
    const comment = await withClient(db.urls[0]!, (c) =>
      c.query<{ c: string }>(`select obj_description('ex0.photos'::regclass) as c`),
    );
    expect(comment.rows[0]!.c).toBe('from exec');
  });

  it('reports a failing shard by number, prints the rows of the others and exits 1', async () => {
    await withClient(db.urls[1]!, (c) =>
      c.query('create table ex6.only_here (x int); insert into ex6.only_here values (42)'),
    );
    const run = await runCli([
      'exec',
      '-c',
      fleet.configFile,
      '--json',
      '--concurrency',
      '3',
      'select x from only_here',
    ]);
    expect(run.code).toBe(1);
    // stdout holds the rows and the failures, one document, whose message names host and shards.
    const out = JSON.parse(run.stdout) as {
      rows: unknown[];
      error: { code: string; exitCode: number; message: string; data: { failed: number[]; failures: unknown[] } };
    };
    expect(out.rows).toEqual([{ shard: 6, x: 42 }]);
    expect(out.error).toMatchObject({ code: 'SHARDS_FAILED', exitCode: 1, data: { failed: [0, 1, 2, 3, 4, 5, 7] } });
    expect(out.error.message).toContain('7 of 8 shards failed: shards 0-3 on pg1: relation "only_here" does not exist');
    expect(out.error.data.failures[0]).toEqual({
      shard: 0,
      host: 'pg1',
      code: '42P01',
      message: 'relation "only_here" does not exist (SQLSTATE 42P01)',
    });
    expect(run.stderr).toContain('7 of 8 shards failed: shards 0-5,7');
    expect(run.stderr).toContain('shards 0-3 on pg1: relation "only_here" does not exist');
  });

  it('keeps every digit of a number inside json and jsonb: nested when exact, else the text PostgreSQL returned', async () => {
    const sql = `select jsonb_build_object('id', 4040925087367430144::bigint) as big, '{"n": 12, "s": "x"}'::json as small`;
    const run = await runCli(['exec', '-c', fleet.configFile, '--json', '--shards', '2', sql]);
    expect(run.code, run.stderr).toBe(0);
    expect(JSON.parse(run.stdout)).toEqual([
      { shard: 2, big: '{"id": 4040925087367430144}', small: { n: 12, s: 'x' } },
    ]);
    const table = await runCli(['exec', '-c', fleet.configFile, '--shards', '2', sql]);
    expect(table.stdout).toContain('4040925087367430144');
  });

  it('names the one shard a read-only statement fails on when the shards around it ran in the same round trip', async () => {
    // Only shard 5 holds a 'five' photo: 1 / 0 there, 1 everywhere else.
    const sql = `select current_schema() as s, 1 / (1 - count(*) filter (where caption = 'five'))::int as x from photos`;
    const run = await runCli(['exec', '-c', fleet.configFile, '--json', '--concurrency', '1', sql]);
    expect(run.code).toBe(1);
    const out = JSON.parse(run.stdout) as { rows: unknown[]; error: { data: { failures: unknown[] } } };
    expect(out.rows).toEqual([0, 1, 2, 3, 4, 6, 7].map((shard) => ({ shard, s: `ex${shard}`, x: 1 })));
    expect(out.error.data.failures).toEqual([
      { shard: 5, host: 'pg2', code: '22012', message: 'division by zero (SQLSTATE 22012)' },
    ]);
    expect(run.stderr).toContain('1 of 8 shards failed: shard 5');
    expect(run.stderr).toContain('shard 5 on pg2: division by zero (SQLSTATE 22012)');
  });

  it('prints the last statement of a multi-statement text, a trailing comment and semicolons included', async () => {
    const run = await runCli([
      'exec',
      '-c',
      fleet.configFile,
      '--csv',
      'select 1 as a; select current_schema() as s, 2::bigint as b; -- done;',
    ]);
    expect(run.code).toBe(0);
    expect(run.stdout).toBe(`shard,s,b\n${Array.from({ length: 8 }, (_, i) => `${i},ex${i},2\n`).join('')}`);
  });

  it.each([
    [['--concurrency', '0'], 'option --concurrency "0"'],
    [['--shards', '7-9'], 'option --shards "7-9": shard 8 is not in the map (0-7)'],
    [['--shards', 'x'], 'option --shards: invalid shard list "x"'],
    [['--json', '--csv'], 'options --json and --csv: choose one'],
  ])('refuses bad input %j with exit 2 naming the argument', async (args, message) => {
    const run = await runCli(['exec', '-c', fleet.configFile, ...args, 'select 1']);
    expect(run.code).toBe(2);
    expect(run.stderr).toContain(message);
  });
});

describe('shardctl exec: passwords in what it prints', () => {
  it('leaves data and its own words as they are when PGPASSWORD is a common word, and hides it where it is a password', async () => {
    const run = await runCli(
      ['exec', '--json', '--shards', '0-1', "select 'my shard' as note", '-c', fleet.configFile],
      {
        env: { PGPASSWORD: 'shard' },
      },
    );
    expect(run.code, run.stderr).toBe(0);
    const rows = JSON.parse(run.stdout) as { shard: number; note: string }[];
    expect(rows).toEqual([
      { shard: 0, note: 'my shard' },
      { shard: 1, note: 'my shard' },
    ]);
    expect(run.stderr).toMatch(/2 shards/);
  });

  it('masks a distinctive password among the rows in the table and CSV output, as in JSON', async () => {
    const password = `Rw7-${process.pid}-secret`;
    const sql = `select 'pw: ${password}' as note`;
    for (const format of [[], ['--csv'], ['--json']]) {
      const run = await runCli(['exec', ...format, '--shards', '0', sql, '-c', fleet.configFile], {
        env: { PGPASSWORD: password },
      });
      expect(run.code, run.stderr).toBe(0);
      expect(run.stdout).toContain('pw: ***');
      expect(run.stdout + run.stderr).not.toContain(password);
    }
  });

  it('prints a valid JSON error, exit 2, whatever PGPASSWORD holds', async () => {
    for (const password of ['"USAGE"', '"},{"x":"y-12345']) {
      const run = await runCli(['exec', '--json', '--shards', '1-', 'select 1', '-c', fleet.configFile], {
        env: { PGPASSWORD: password },
      });
      expect(run.code, run.stderr).toBe(2);
      expect((JSON.parse(run.stdout) as { error: { code: string } }).error.code).toBe('USAGE');
    }
    // A distinctive one is masked before it is escaped: in no form in the document.
    const password = '"},{"x":"y-12345';
    // The refusal quotes the statement, password and all.
    const run = await runCli(['exec', '--json', `select pg_advisory_lock(1), '${password}'`, '-c', fleet.configFile], {
      env: { PGPASSWORD: password },
    });
    expect(run.code, run.stderr).toBe(2);
    expect(JSON.parse(run.stdout)).toMatchObject({ error: { code: 'USAGE', message: expect.stringContaining('***') } });
    expect(run.stdout).not.toContain(JSON.stringify(password).slice(1, -1));
    expect(run.stdout).not.toContain(password);
  });
});

describe('shardctl psql', () => {
  /** A stand-in for psql that records its arguments and environment, then runs the real psql with them. */
  function fakePsql(): { script: string; dir: string } {
    const dir = tempDir('shardctl-psql-');
    const script = join(dir, 'psql');
    writeFileSync(
      script,
      `#!/bin/sh
printf '%s\\n' "$0" "$@" > "${dir}/argv"
env > "${dir}/env"
if [ -n "$PGSERVICEFILE" ]; then cp "$PGSERVICEFILE" "${dir}/service"; stat -c %a "$PGSERVICEFILE" > "${dir}/service-mode"; fi
exec psql -X -A -t -c 'select current_schema()' "$@" > "${dir}/schema" 2>&1
`,
    );
    chmodSync(script, 0o755);
    return { script, dir };
  }

  const password = () => new URL(db.urls[0]!).password;

  it.each([
    [['5'], 'ex5'],
    [['--key', '13'], 'ex5'],
    [['--key', '8'], 'ex0'],
  ])(
    'runs psql %j on the shard host with search_path set and no password on the command line',
    async (args, schema) => {
      const fake = fakePsql();
      const run = await runCli(['psql', '-c', fleet.configFile, ...args], { env: { SHARDCTL_PSQL: fake.script } });
      expect(run.code).toBe(0);
      const argv = readFileSync(join(fake.dir, 'argv'), 'utf8');
      const env = readFileSync(join(fake.dir, 'env'), 'utf8');
      expect(password().length).toBeGreaterThan(4);
      expect(argv).not.toContain(password());
      expect(run.stdout + run.stderr).not.toContain(password());
      const { hostname, port } = new URL(schema === 'ex5' ? db.urls[1]! : db.urls[0]!);
      expect(argv.split('\n')[1]).toBe(`postgres://postgres@${hostname}:${port}/${db.name}`);
      expect(env).toContain(`PGPASSWORD=${password()}\n`);
      expect(env).toContain(`PGOPTIONS=-c search_path="${schema}"\n`);
      // The real psql, started with exactly that, lands in the shard's schema.
      expect(readFileSync(join(fake.dir, 'schema'), 'utf8').trim()).toBe(schema);
    },
  );

  it('moves a password given as ?password= into PGPASSWORD as well', () => {
    const config = parseConfig(
      'shards: 2\nhosts:\n  - name: a\n    url: postgres://app@db1:5433/app?password=s3cr3t-pw&sslmode=require\n    shards: "0-1"\n',
      { file: 'inline.yaml', checkMigrationsDir: false },
    );
    const call = psqlInvocation(config, 1, { PGOPTIONS: '-c work_mem=64MB' });
    expect(call.args).toEqual(['postgres://app@db1:5433/app?sslmode=require']);
    expect(call.env['PGPASSWORD']).toBe('s3cr3t-pw');
    expect(call.env['PGOPTIONS']).toBe('-c work_mem=64MB -c search_path="insta1"');
    expect(call.display.url).not.toContain('s3cr3t-pw');
  });

  it('hands psql an sslpassword in a service file of its own, not on the command line', async () => {
    // sslmode=disable: libpq reads the sslpassword but has no key to use it on, so the real psql
    // still connects, and fails if the service the environment names is not in the file.
    const url = new URL(db.urls[0]!);
    const secret = `Kx9-${process.pid}-${Date.now()}`;
    const withKey = `${url.toString()}?sslmode=disable&sslpassword=${encodeURIComponent(secret)}`;
    const keyed = makeFleet({ urls: [withKey, db.urls[1]!], shards: 8, split: ['0-3', '4-7'], schemaPrefix: 'ex' });
    const fake = fakePsql();
    const run = await runCli(['psql', '-c', keyed.configFile, '2'], { env: { SHARDCTL_PSQL: fake.script } });
    expect(run.code, run.stderr).toBe(0);
    const argv = readFileSync(join(fake.dir, 'argv'), 'utf8');
    expect(argv).not.toContain(secret);
    expect(argv).not.toContain('sslpassword');
    expect(run.stdout + run.stderr).not.toContain(secret);
    const env = readFileSync(join(fake.dir, 'env'), 'utf8');
    expect(env).not.toContain(secret);
    expect(env).toContain('PGSERVICE=shardctl_psql\n');
    const serviceFile = /^PGSERVICEFILE=(.*)$/m.exec(env)?.[1];
    expect(readFileSync(join(fake.dir, 'service'), 'utf8')).toBe(`[shardctl_psql]\nsslpassword=${secret}\n`);
    expect(readFileSync(join(fake.dir, 'service-mode'), 'utf8').trim()).toBe('600');
    // Gone once psql has ended.
    expect(serviceFile && existsSync(serviceFile)).toBe(false);
    expect(readFileSync(join(fake.dir, 'schema'), 'utf8').trim()).toBe('ex2');
  });

  it('finds the shard of an id', async () => {
    const fake = fakePsql();
    const run = await runCli(['psql', '-c', fleet.configFile, '--id', photoId], {
      env: { SHARDCTL_PSQL: fake.script },
    });
    expect(run.code).toBe(0);
    expect(readFileSync(join(fake.dir, 'schema'), 'utf8').trim()).toBe('ex5');
  });

  it('without psql on PATH says so and prints the connection string with the password redacted', async () => {
    const run = await runCli(['psql', '-c', fleet.configFile, '2'], {
      env: { PATH: '/nonexistent', SHARDCTL_PSQL: '' },
    });
    expect(run.code).toBe(1);
    expect(run.stderr).toContain('psql is not on PATH');
    const { hostname, port } = new URL(db.urls[0]!);
    expect(run.stdout.trim()).toBe(`postgres://postgres:***@${hostname}:${port}/${db.name}`);
    expect(run.stdout + run.stderr).not.toContain(password());
  });

  it('hides a password given as a percent-encoded query keyword (?pass%77ord=) in what it prints', async () => {
    // A password of its own (this process has met the databases' real one): whether the server
    // takes it does not matter to what psql is shown.
    const url = new URL(db.urls[0]!);
    const secret = `Qp7-${process.pid}-${Date.now()}`;
    url.password = '';
    const encoded = `${url.toString()}?pass%77ord=${encodeURIComponent(secret)}`;
    const keyword = makeFleet({ urls: [encoded, db.urls[1]!], shards: 8, split: ['0-3', '4-7'], schemaPrefix: 'ex' });
    const run = await runCli(['psql', '-c', keyword.configFile, '2'], {
      env: { PATH: '/nonexistent', SHARDCTL_PSQL: '' },
    });
    expect(run.code, run.stderr).toBe(1);
    expect(run.stdout).toMatch(/pass%77ord=\*\*\*/);
    expect(run.stdout + run.stderr).not.toContain(secret);
    expect(run.stdout + run.stderr).not.toContain(encodeURIComponent(secret));
  });

  it.each([
    [[], 'give exactly one of <shard>, --key K or --id ID'],
    [['1', '--key', '2'], 'give exactly one of'],
    [['--id', '12x'], 'option --id "12x"'],
    [['99'], 'argument <shard> 99: not in the map (0-7)'],
    [
      ['--key', '9223372036854775808'],
      'option --key "9223372036854775808": expected a whole number from 0 to 2^63 - 1',
    ],
    [['--key', '-1'], 'option --key "-1"'],
  ])('refuses %j with exit 2', async (args, message) => {
    const run = await runCli(['psql', '-c', fleet.configFile, ...args], { env: { SHARDCTL_PSQL: '/bin/false' } });
    expect(run.code).toBe(2);
    expect(run.stderr).toContain(message);
  });

  it("a psql that fails (its connection, exit 2; a script's error, exit 3) is a failure at run time: exit 1, naming the shard and host", async () => {
    for (const code of [2, 3]) {
      const dir = tempDir('shardctl-psql-');
      const script = join(dir, 'psql');
      writeFileSync(script, `#!/bin/sh\nexit ${code}\n`);
      chmodSync(script, 0o755);
      const run = await runCli(['psql', '-c', fleet.configFile, '5'], { env: { SHARDCTL_PSQL: script } });
      expect(run.code, `psql exit ${code}`).toBe(1);
      expect(run.stderr).toContain(`psql ended with exit code ${code} (shard 5, ex5 on pg`);
    }
  });
});
