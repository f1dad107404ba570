#!/usr/bin/env node
// Thin launcher: the CLI is compiled to dist/ by `npm install` (the prepare script).

// pg 8 tells a Cloudflare Worker from Node by `navigator.userAgent`, and where there is no
// navigator (Node 20) by building a fetch Response, which loads undici: a cost on every start-up
// for nothing. Node >= 21 has a navigator; on 20 one stands in while pg is loaded, then goes.
const stand = globalThis.navigator === undefined;
if (stand) Object.defineProperty(globalThis, 'navigator', { value: { userAgent: `Node.js/${process.versions.node.split(".")[0]}` }, configurable: true });
const { main } = await import('../dist/cli/main.js');
if (stand) delete globalThis.navigator;

// `shardctl init --dry-run | head`: a closed pipe ends the output quietly, not with a stack trace.
process.stdout.on('error', (error) => {
  if (error.code === 'EPIPE') process.exit(process.exitCode ?? 0);
  throw error;
});

main(process.argv).then((code) => {
  process.exitCode = code;
});
