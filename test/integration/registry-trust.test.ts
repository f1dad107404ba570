import { randomBytes } from 'node:crypto';
import { createServer, type Server } from 'node:net';
import { describe, expect, it } from 'vitest';
import { init } from '../../src/commands/init.js';
import { status } from '../../src/commands/status.js';
import { ShardRouter } from '../../src/router/router.js';
import { makeFleet, runCli } from '../helpers/fleet.js';
import { useTestDatabases, withClient } from '../helpers/hosts.js';
import { startOwnClusters } from '../helpers/moves.js';

const suffix = randomBytes(4).toString('hex');
const WRITER = `registry_writer_${suffix}`;

/**
 * A server that asks every client for its password in cleartext (AuthenticationCleartextPassword)
 * and records what comes back: what an attacker's address in the registry would see.
 */
async function passwordTrap(): Promise<{
  port: number;
  received: string[];
  connections: () => number;
  close(): Promise<void>;
}> {
  const received: string[] = [];
  let connections = 0;
  const server: Server = createServer((socket) => {
    connections += 1;
    let asked = false;
    socket.on('data', (chunk: Buffer) => {
      if (!asked) {
        asked = true;
        // 'R', length 8, code 3: cleartext password, please.
        socket.write(Buffer.from([0x52, 0, 0, 0, 8, 0, 0, 0, 3]));
        return;
      }
      if (chunk[0] === 0x70) received.push(chunk.subarray(5).toString('utf8').replace(/\0$/, ''));
      socket.destroy();
    });
    socket.on('error', () => undefined);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as { port: number }).port;
  return {
    port,
    received,
    connections: () => connections,
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
}

describe('the host registry is not a way in', () => {
  const db = useTestDatabases(2);

  it('a router opened from a seed whose registry another role can write uses none of its addresses and sends no password there; status names the role and the address', async () => {
    const fleet = makeFleet({ urls: db.urls, shards: 4, schemaPrefix: 'rt' });
    const config = await fleet.config();
    expect((await init(config)).ok).toBe(true);
    const trap = await passwordTrap();
    try {
      // A role that was given UPDATE on the registry points pg2 at its own server.
      await withClient(db.urls[0]!, async (client) => {
        await client.query(`DROP ROLE IF EXISTS ${WRITER}`).catch(() => undefined);
        await client.query(`CREATE ROLE ${WRITER}`);
        await client.query(
          `GRANT USAGE ON SCHEMA shardctl TO ${WRITER}; GRANT SELECT, UPDATE ON shardctl.hosts TO ${WRITER}`,
        );
        await client.query(`SET ROLE ${WRITER}`);
        await client.query(`UPDATE shardctl.hosts SET address = $1 WHERE name = 'pg2'`, [
          `postgres://127.0.0.1:${trap.port}/trap`,
        ]);
        await client.query('RESET ROLE');
      });
      const warnings: string[] = [];
      const onWarning = (w: Error & { code?: string }) => {
        if (w.code === 'SHARDCTL_REGISTRY_WRITABLE') warnings.push(w.message);
      };
      process.on('warning', onWarning);
      const router = await ShardRouter.open({ seeds: [db.urls[0]!] });
      try {
        // pg1's shards work; pg2's address came only from the distrusted registry: not used.
        await router.withShard(0, (client) => client.query(`INSERT INTO photos (user_id, image_url) VALUES (1, 'x')`));
        await router.withShard(3, (client) => client.query('SELECT 1')).catch(() => undefined);
        await new Promise((resolve) => setTimeout(resolve, 100));
        expect(trap.received).toEqual([]);
        expect(trap.connections()).toBe(0);
        expect(warnings.join('\n')).toContain(`writable by ${WRITER}`);
      } finally {
        await router.close();
        process.off('warning', onWarning);
      }

      const found = await status(config);
      expect(found.ok).toBe(false);
      expect(found.hosts[0]!.controlWriters).toContainEqual({ table: 'shardctl.hosts', role: WRITER });
      expect(found.hosts[0]!.registryMismatches.map((m) => m.name)).toEqual(['pg2']);
      const cli = await runCli(['status', '-c', fleet.configFile]);
      expect(cli.code).toBe(3);
      expect(cli.stdout + cli.stderr).toContain(`control table shardctl.hosts is writable by role ${WRITER}`);
      expect(cli.stdout + cli.stderr).toContain(`registry: host pg2 at postgres://127.0.0.1:${trap.port}/trap`);

      // Revoked, and the address put back by init: trusted again, status clean.
      await withClient(db.urls[0]!, (client) => client.query(`REVOKE ALL ON shardctl.hosts FROM ${WRITER}`));
      expect((await init(config)).ok).toBe(true);
      const after = await status(config);
      expect(after.hosts.map((h) => [h.controlWriters, h.registryMismatches])).toEqual([
        [[], []],
        [[], []],
      ]);
    } finally {
      await trap.close();
    }
  });
  it('a right to write the registry by a column grant, TRIGGER, pg_write_all_data or an indirect membership of the owner is seen as one too', async () => {
    // pg_write_all_data and a membership of the owner (the bootstrap superuser) reach every
    // database of a server: pg1 is a server of this test's own, so that no other test's status on
    // a shared server sees these writers meanwhile.
    const own = await startOwnClusters([{}]);
    try {
      await registryWriteWays([own.clusters[0]!.url, db.urls[1]!]);
    } finally {
      await own.dispose();
    }
  });
});

async function registryWriteWays(urls: string[]): Promise<void> {
  const fleet = makeFleet({ urls, shards: 4, schemaPrefix: 'rt' });
  const config = await fleet.config();
  expect((await init(config)).ok).toBe(true);
  const role = `registry_way_${suffix}`;
  const group = `registry_group_${suffix}`;
  const owner = await withClient(urls[0]!, async (client) => {
    await client.query(`DROP ROLE IF EXISTS ${role}`).catch(() => undefined);
    await client.query(`DROP ROLE IF EXISTS ${group}`).catch(() => undefined);
    await client.query(`CREATE ROLE ${role}; CREATE ROLE ${group}`);
    return (
      await client.query<{ owner: string }>(
        `SELECT tableowner AS owner FROM pg_tables WHERE schemaname = 'shardctl' AND tablename = 'hosts'`,
      )
    ).rows[0]!.owner;
  });
  const trap = await passwordTrap();
  try {
    await withClient(urls[0]!, (client) =>
      client.query(`UPDATE shardctl.hosts SET address = $1 WHERE name = 'pg2'`, [
        `postgres://127.0.0.1:${trap.port}/trap`,
      ]),
    );
    const ways: [string, string, string][] = [
      [
        'shardctl.hosts',
        `GRANT UPDATE (address) ON shardctl.hosts TO ${role}`,
        `REVOKE UPDATE (address) ON shardctl.hosts FROM ${role}`,
      ],
      [
        'shardctl.placement',
        `GRANT INSERT (shard, host, version) ON shardctl.placement TO ${role}`,
        `REVOKE INSERT (shard, host, version) ON shardctl.placement FROM ${role}`,
      ],
      ['shardctl.hosts', `GRANT TRIGGER ON shardctl.hosts TO ${role}`, `REVOKE TRIGGER ON shardctl.hosts FROM ${role}`],
      ['shardctl.hosts', `GRANT pg_write_all_data TO ${role}`, `REVOKE pg_write_all_data FROM ${role}`],
      [
        'shardctl.hosts',
        `GRANT "${owner}" TO ${group}; GRANT ${group} TO ${role}`,
        `REVOKE ${group} FROM ${role}; REVOKE "${owner}" FROM ${group}`,
      ],
    ];
    for (const [table, give, take] of ways) {
      await withClient(urls[0]!, (client) => client.query(give));
      const found = await status(config);
      expect(found.hosts[0]!.controlWriters, give).toContainEqual({ table, role });
      const router = await ShardRouter.open({ seeds: [urls[0]!] });
      try {
        await router.withShard(3, (client) => client.query('SELECT 1')).catch(() => undefined);
        await new Promise((resolve) => setTimeout(resolve, 100));
        expect(trap.connections(), give).toBe(0);
      } finally {
        await router.close();
        await withClient(urls[0]!, (client) => client.query(take));
      }
    }
    // pg_write_all_data without a member names no one.
    const after = await status(config);
    expect(after.hosts[0]!.controlWriters).toEqual([]);
  } finally {
    await trap.close();
    await withClient(urls[0]!, (client) => client.query(`DROP ROLE IF EXISTS ${role}; DROP ROLE IF EXISTS ${group}`));
  }
}
