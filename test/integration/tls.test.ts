import { execFileSync } from 'node:child_process';
import { chmod, chown, mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { init } from '../../src/commands/init.js';
import type { HostConfig } from '../../src/config/types.js';
import { connectHost } from '../../src/fleet/connect.js';
import {
  ensurePostgresOsUser,
  findFreePort,
  initCluster,
  startCluster,
  stopCluster,
  type LocalClusterOptions,
} from '../../src/dev/local-postgres.js';
import { ShardRouter } from '../../src/router/router.js';
import { makeFleet } from '../helpers/fleet.js';

/**
 * A server of its own that accepts TLS connections only (pg_hba.conf: hostssl, nothing else),
 * with a certificate for localhost and 127.0.0.1 signed by a CA this test makes: libpq's sslmode
 * semantics for every URL shardctl takes.
 */
describe('TLS with libpq sslmode semantics', () => {
  let dir = '';
  let cluster: LocalClusterOptions | undefined;
  const password = 'tls-test-pw';
  let port = 0;
  const url = (host: string, query: string) => `postgres://postgres:${password}@${host}:${port}/postgres?${query}`;
  const hostConfig = (u: string): HostConfig => ({
    name: 'tls',
    url: u,
    directUrl: u,
    replicationUrl: u,
    shardsSpec: '',
    shards: [],
    weight: 1,
    drain: false,
    timeoutMs: 10_000,
  });
  const ca = () => path.join(dir, 'ca.crt');

  beforeAll(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'shardctl-tls-'));
    await chmod(dir, 0o755);
    const openssl = (...args: string[]) => execFileSync('openssl', args, { cwd: dir, stdio: 'pipe' });
    openssl(
      'req',
      '-x509',
      '-newkey',
      'rsa:2048',
      '-nodes',
      '-days',
      '2',
      '-subj',
      '/CN=shardctl test CA',
      '-keyout',
      'ca.key',
      '-out',
      'ca.crt',
    );
    openssl(
      'req',
      '-newkey',
      'rsa:2048',
      '-nodes',
      '-subj',
      '/CN=localhost',
      '-keyout',
      'server.key',
      '-out',
      'server.csr',
    );
    await writeFile(path.join(dir, 'san.ext'), 'subjectAltName=DNS:localhost,IP:127.0.0.1\n');
    openssl(
      'x509',
      '-req',
      '-in',
      'server.csr',
      '-CA',
      'ca.crt',
      '-CAkey',
      'ca.key',
      '-CAcreateserial',
      '-days',
      '2',
      '-extfile',
      'san.ext',
      '-out',
      'server.crt',
    );
    const account = process.getuid?.() === 0 ? await ensurePostgresOsUser() : undefined;
    if (account) for (const f of ['server.key', 'server.crt']) await chown(path.join(dir, f), account.uid, account.gid);
    await chmod(path.join(dir, 'server.key'), 0o600);
    port = await findFreePort();
    cluster = {
      dataDir: path.join(dir, 'data'),
      port,
      password,
      settings: {
        ssl: 'on',
        ssl_cert_file: path.join(dir, 'server.crt'),
        ssl_key_file: path.join(dir, 'server.key'),
        wal_level: 'logical',
        // 127.0.0.2: an address the certificate does not name.
        listen_addresses: '127.0.0.1,127.0.0.2',
      },
    };
    await initCluster(cluster);
    const hba = path.join(cluster.dataDir, 'pg_hba.conf');
    await writeFile(
      hba,
      'local all all trust\nhostssl all all 127.0.0.0/8 scram-sha-256\nhostssl all all ::1/128 scram-sha-256\n',
    );
    if (account) await chown(hba, account.uid, account.gid);
    await startCluster(cluster);
  }, 120_000);

  afterAll(async () => {
    if (cluster) await stopCluster(cluster).catch(() => undefined);
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  const attempt = async (u: string): Promise<string> => {
    try {
      const client = await connectHost(hostConfig(u));
      const r = await client.query<{ ssl: boolean }>('SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()');
      await client.end();
      return r.rows[0]!.ssl ? 'tls' : 'plain';
    } catch (error) {
      return `refused: ${(error as Error).message}`;
    }
  };

  it.each([
    ['require: encrypted, the certificate not checked', '127.0.0.1', 'sslmode=require', 'tls'],
    [
      'verify-full with the CA and the name on the certificate',
      'localhost',
      `sslmode=verify-full&sslrootcert=CA`,
      'tls',
    ],
    ['verify-full with the CA and the IP on the certificate', '127.0.0.1', `sslmode=verify-full&sslrootcert=CA`, 'tls'],
    ['verify-ca: the CA, whatever the name', '127.0.0.2', `sslmode=verify-ca&sslrootcert=CA`, 'tls'],
  ])('connects with %s', async (_, host, query, expected) => {
    expect(await attempt(url(host, query.replace('CA', ca())))).toBe(expected);
  });

  it.each([
    ['disable: the server takes TLS only', '127.0.0.1', 'sslmode=disable', /no pg_hba.conf entry|SSL off/],
    [
      'verify-full without the CA: not in Node’s store',
      '127.0.0.1',
      'sslmode=verify-full',
      /self[- ]signed|unable to verify|certificate/i,
    ],
    [
      'verify-full with a name not on the certificate',
      '127.0.0.2',
      `sslmode=verify-full&sslrootcert=CA`,
      /altnames|does not match|Hostname/i,
    ],
  ])('refuses %s', async (_, host, query, pattern) => {
    expect(await attempt(url(host, query.replace('CA', ca())))).toMatch(pattern);
  });

  it('init and a router work over sslmode=require, as psql does', async () => {
    const fleet = makeFleet({ urls: [url('127.0.0.1', 'sslmode=require')], shards: 2, schemaPrefix: 'tl' });
    const config = await fleet.config();
    expect((await init(config)).ok).toBe(true);
    const router = await ShardRouter.open(fleet.configFile);
    try {
      const r = await router.withShard(1, (client) =>
        client.query<{ ssl: boolean }>('SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()'),
      );
      expect(r.rows[0]!.ssl).toBe(true);
    } finally {
      await router.close();
    }
  });
});
