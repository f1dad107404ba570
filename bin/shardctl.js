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

// Output never decides whether a command finishes. A reader that went away (`shardctl … | head`,
// a closed pipe, a dropped SSH session) loses the rest of the output, and the command goes on to
// its end and its exit code: a move is never left half way because nobody reads its progress.
const GONE_READER = new Set(['EPIPE', 'ECONNRESET', 'EIO', 'ERR_STREAM_DESTROYED']);
for (const stream of [process.stdout, process.stderr]) {
  stream.on('error', (error) => {
    if (!GONE_READER.has(error.code)) throw error;
  });
}
// The terminal closing (SIGHUP) does not stop a command either: it carries on to the end, its
// output dropped. SIGINT and SIGTERM still stop it, at once, and say what is left: every step a
// command takes can be run again or undone after a stop anywhere (a move: --resume or --abort),
// and status names what is under way. A command that passes SIGINT on itself (psql) keeps it.
for (const [signal, code] of [
  ['SIGINT', 130],
  ['SIGTERM', 143],
]) {
  process.on(signal, () => {
    if (process.listenerCount(signal) > 1) return;
    const message = `stopped by ${signal}; what it left under way is named by shardctl status: run the same command again, or for a move --resume or --abort`;
    try {
      if (process.argv.includes('--json'))
        process.stdout.write(
          `${JSON.stringify({ error: { code: 'INTERRUPTED', message, exitCode: code } }, null, 2)}\n`,
        );
      process.stderr.write(`\nshardctl: ${message}\n`);
    } finally {
      process.exit(code);
    }
  });
}
process.on('SIGHUP', () => {});

main(process.argv).then((code) => {
  process.exitCode = code;
});
