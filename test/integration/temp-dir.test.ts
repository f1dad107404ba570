import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it, vi } from 'vitest';
import { useRunTempDir } from '../helpers/global-setup.js';
import { tempDir } from '../helpers/temp.js';

const ROOT = path.join(import.meta.dirname, '..', '..');

describe("the test run's temp directory", () => {
  it('is a folder of its own, shardctl-run-*, that the global setup made for this run', () => {
    expect(path.basename(os.tmpdir())).toMatch(/^shardctl-run-/);
    expect(process.env.TMPDIR).toBe(os.tmpdir());
  });

  it("removes a file's temp folders after the file, also when its test failed", async () => {
    const report = path.join(tempDir('shardctl-report-'), 'made');
    const config = path.join(tempDir('shardctl-vitest-'), 'vitest.config.mjs');
    // A vitest of its own, without the global setup (no hosts): only the failing file.
    writeFileSync(
      config,
      `export default { test: { root: ${JSON.stringify(ROOT)}, include: ['test/fixtures/temp/*.fixture.ts'] } };\n`,
    );
    const child = spawn(
      process.execPath,
      [path.join(ROOT, 'node_modules', 'vitest', 'vitest.mjs'), 'run', '--config', config],
      {
        cwd: ROOT,
        env: { ...process.env, SHARDCTL_TEMP_REPORT: report, NO_COLOR: '1' },
        stdio: ['ignore', 'pipe', 'pipe'],
      },
    );
    let output = '';
    child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()));
    const code = await new Promise<number | null>((resolve) => child.once('close', resolve));
    expect(code, output).toBe(1);
    expect(output).toContain('failing on purpose');
    const made = readFileSync(report, 'utf8');
    expect(path.basename(made)).toMatch(/^shardctl-fleet-/);
    expect(existsSync(made)).toBe(false);
  });

  it('is removed at the end of the run, naming what a test left in it', async () => {
    const outer = process.env.TMPDIR;
    const write = vi.spyOn(process.stderr, 'write').mockImplementation(() => true);
    try {
      const remove = await useRunTempDir();
      const runDir = os.tmpdir();
      expect(runDir).not.toBe(outer);
      mkdirSync(path.join(runDir, 'shardctl-fleet-left'));
      await remove();
      expect(existsSync(runDir)).toBe(false);
      expect(os.tmpdir()).toBe(outer);
      expect(write.mock.calls.map((call) => String(call[0])).join('')).toContain(
        'removing 1 entries the tests left in the temp directory: shardctl-fleet-left',
      );
    } finally {
      write.mockRestore();
      process.env.TMPDIR = outer;
    }
  });
});
