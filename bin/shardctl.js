#!/usr/bin/env node
// Thin launcher: the CLI is compiled to dist/ by `npm install` (the prepare script).
import { main } from '../dist/cli/main.js';

main(process.argv).then((code) => {
  process.exitCode = code;
});
