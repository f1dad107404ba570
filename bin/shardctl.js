#!/usr/bin/env node
// Thin launcher: `npm install` (the prepare script: tsc, then scripts/bundle-cli.js) compiles the
// CLI and bundles it into dist/bundle/. main.js there holds commander and the command definitions;
// the library is a second module, loaded only when a command runs (src/cli/library.ts).
import module from 'node:module';

// Node >= 22.1 can keep the compiled code of the modules between runs (in the temp directory):
// start-up then skips most of the parsing. Node 20 has no such cache; there this does nothing.
module.enableCompileCache?.();

const { main } = await import('../dist/bundle/main.js').catch((error) => {
  // A checkout that was never built (or built by tsc alone): say how to build, not a stack trace.
  if (error.code !== 'ERR_MODULE_NOT_FOUND' || !String(error.message).includes('dist/bundle/main.js')) throw error;
  process.stderr.write('shardctl: dist/bundle/main.js is missing; run `npm run build` (npm install runs it)\n');
  process.exit(1);
});

// `shardctl init --dry-run | head`: a closed pipe ends the output quietly, not with a stack trace.
process.stdout.on('error', (error) => {
  if (error.code === 'EPIPE') process.exit(process.exitCode ?? 0);
  throw error;
});

main(process.argv).then((code) => {
  process.exitCode = code;
});
