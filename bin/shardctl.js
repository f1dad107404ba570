#!/usr/bin/env node
// Thin launcher: the CLI is compiled to dist/ by `npm install` (the prepare script). It loads
// commander and the command definitions; the library loads only when a command runs
// (src/cli/library.ts).
const { main } = await import('../dist/cli/main.js');

// `shardctl init --dry-run | head`: a closed pipe ends the output quietly, not with a stack trace.
process.stdout.on('error', (error) => {
  if (error.code === 'EPIPE') process.exit(process.exitCode ?? 0);
  throw error;
});

main(process.argv).then((code) => {
  process.exitCode = code;
});
