/**
 * A connection that died silently while its host is fine (issue 41, point 6): a TCP proxy in front
 * of pg2 stops passing bytes on the connections open at a chosen moment (as a NAT gateway that
 * dropped an idle flow, or a pooler that lost its server connection) while new connections work.
 * The watchdog's new connection gets an answer, so the host is not silent; it then asks whether the
 * old connection's server process is still running the statement (pg_stat_activity), finds it idle,
 * and fails the wait. With hostTimeout 2s every command ends within a few seconds naming pg2, and a
 * router call runs again on a new connection.
 */
import { beforeAll, describe, expect, it } from 'vitest';
import { ShardRouter } from '../../src/index.js';
import { type Fleet, runCli } from '../helpers/fleet.js';
import { timed, type TcpProxy, useProxiedFleet } from '../helpers/tcp-proxy.js';

const BOUND_MS = 2000;
/** Noticed after one bound of silence, then a probe and a pg_stat_activity query; slack for a loaded machine. */
const WITHIN_MS = BOUND_MS + 5000;
const LOST =
  /pg2.*the connection was lost: the host answers a new connection, but this connection's server process \(pid \d+\) is (idle|idle in transaction)/;

describe('a connection lost on the way while its host is fine', () => {
  const { proxy: proxyOf, fleet: fleetOf } = useProxiedFleet();
  let proxy: TcpProxy;
  let fleet: Fleet;
  beforeAll(() => {
    proxy = proxyOf();
    fleet = fleetOf();
  });

  it.each([
    ['status', ['status']],
    ['migrate --check', ['migrate', '--check']],
    ['migrate', ['migrate']],
  ])(
    '%s ends within the bound naming pg2 as reachable with its connection lost',
    { timeout: 30_000 },
    async (_, args) => {
      // Past the start-up and the first statements: the connection open then stops passing bytes.
      proxy.stallEstablishedAfter(400);
      const { value: run, ms } = await timed(() => runCli([...args, '-c', fleet.configFile]));
      expect(ms).toBeLessThan(WITHIN_MS);
      expect(run.code).toBe(1);
      expect(run.stdout + run.stderr).toMatch(LOST);
      expect(run.stdout + run.stderr).not.toMatch(/could not run SELECT 1/);
    },
  );

  it(
    'router: a call whose pooled connection was lost runs again on a new one within the bound',
    { timeout: 30_000 },
    async () => {
      const router = await ShardRouter.open(fleet.configFile, { poolSize: 1 });
      try {
        expect((await router.withShard(5, (c) => c.query('SELECT 1 AS one'))).rows).toEqual([{ one: 1 }]);
        proxy.stallEstablished();
        const { value, ms } = await timed(() =>
          router.withShard(5, (c) => c.query('SELECT 2 AS two'), { readOnly: true }),
        );
        expect(value.rows).toEqual([{ two: 2 }]);
        expect(ms).toBeGreaterThanOrEqual(BOUND_MS);
        expect(ms).toBeLessThan(WITHIN_MS);
      } finally {
        await router.close();
      }
    },
  );
});
