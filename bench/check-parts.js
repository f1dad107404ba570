/**
 * Where the time of `migrate --check` goes: its parts, one after the other in one fresh process,
 * each with its wall and CPU time (process.cpuUsage: user + system of the whole process).
 * `node bench/check-parts.js <config>` prints one JSON object; bench/migrate.js bundles it as the
 * CLI is bundled (scripts/bundle-cli.js: its imports become chunks loaded in 'load the library')
 * and runs the bundle.
 *
 * The parts are the library's own steps (the ones checkMigrations takes), called one by one:
 * loading the library, the config, the migration files, connecting (and the server version),
 * reading every host's catalog, finding conflicts and planning, closing the connections. Node's own
 * start-up is the time from the process's start to this script's first line.
 */
const startedAt = performance.timeOrigin;
/** Each part's wall and CPU time, ms. @type {Record<string, { wallMs: number, cpuMs: number }>} */
const parts = {};
let cpu = process.cpuUsage();
let wall = performance.now();
parts['node start-up'] = { wallMs: wall, cpuMs: (cpu.user + cpu.system) / 1000 };
/** @param {string} name */
const mark = (name) => {
  const used = process.cpuUsage(cpu);
  const now = performance.now();
  parts[name] = { wallMs: now - wall, cpuMs: (used.user + used.system) / 1000 };
  cpu = process.cpuUsage();
  wall = performance.now();
};

// As the CLI loads it (src/cli/library.ts): with a navigator, so pg does not load undici on Node 20.
// Node 20's typings have no navigator; Node 21 and later define one.
const global = /** @type {{ navigator?: unknown }} */ (globalThis);
const stand = global.navigator === undefined;
if (stand) Object.defineProperty(globalThis, 'navigator', { value: { userAgent: 'Node.js' }, configurable: true });
const lib = await import('./check-parts-library.js');
if (stand) delete global.navigator;
const { Fleet, readHostSnapshot, findConflicts, planFleet } = lib;
mark('load the library');

const config = await lib.loadConfig(process.argv[2]);
mark('load the config');
const migrations = await lib.readMigrations(config.migrationsDir);
mark('read the migration files');
const fleet = await Fleet.open(config.hosts);
mark('connect to every host');
const snapshots = await fleet.each((session) => readHostSnapshot(session, config), { tolerateLoss: true });
mark('read every catalog');
const conflicts = findConflicts(config, snapshots, migrations, { checkDrift: true });
const plan = planFleet(config, snapshots, migrations, { create: false });
mark('conflicts and plan');
await fleet.close();
mark('close the connections');

const pending = plan.hosts.reduce((n, h) => n + h.jobs.length, 0);
if (conflicts.length > 0 || pending > 0 || fleet.lost.length > 0) {
  throw new Error(
    `the fleet is not current: ${conflicts.length} conflicts, ${pending} shards pending, ${fleet.lost.length} hosts lost`,
  );
}
process.stdout.write(`${JSON.stringify({ startedAt, parts })}\n`);
