#!/usr/bin/env node
// Thin launcher: the CLI is compiled to dist/ by `npm install` (the prepare script). It loads
// commander and the command definitions; the library loads only when a command runs
// (src/cli/library.ts).
import module from 'node:module';

// Node >= 22.1 can keep the compiled code of the modules between runs (in the temp directory):
// start-up then skips most of the parsing. Node 20 has no such cache; there this does nothing.
module.enableCompileCache?.();

const { main } = await import('../dist/bundle/main.js');

// `shardctl init --dry-run | head`: a closed pipe ends the output quietly, not with a stack trace.
process.stdout.on('error', (error) => {
  if (error.code === 'EPIPE') process.exit(process.exitCode ?? 0);
  throw error;
});

main(process.argv).then((code) => {
  process.exitCode = code;
});
