/**
 * Temp folders of a test file, removed after the file's last test, also when a test failed. The
 * global setup (global-setup.ts) gives each run a temp directory of its own and removes it at the
 * end, naming what a file left in it.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll } from 'vitest';

const made: string[] = [];

/** A new folder `<temp dir>/<prefix>XXXXXX`, removed after the test file. */
export function tempDir(prefix: string): string {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  made.push(dir);
  return dir;
}

// Registered while the test file that imports this module is collected: it belongs to that file.
afterAll(() => {
  for (const dir of made.splice(0)) rmSync(dir, { recursive: true, force: true });
});
