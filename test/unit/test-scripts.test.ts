import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';

const ROOT = join(import.meta.dirname, '..', '..');
const scripts = (JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { scripts: Record<string, string> })
  .scripts;

/** The steps of an npm script, in order (`a && b && c`). */
const steps = (name: string): string[] => scripts[name]!.split('&&').map((step) => step.trim());

describe('every test script installs what its tests need (each works on a fresh clone run alone)', () => {
  it.each([
    ['test', /\bvitest run\b/],
    ['test:containers', /\bvitest run\b/],
    ['test:matrix', /^test\/matrix\.sh$/],
  ])('%s builds, then installs the PostgreSQL 15-17 binaries, before its tests run', (name, runsTests) => {
    const list = steps(name);
    const build = list.indexOf('npm run build');
    const install = list.findIndex((step) => step.startsWith('test/matrix-binaries/install.sh'));
    const tests = list.findIndex((step) => runsTests.test(step));
    expect(build, scripts[name]).toBe(0);
    expect(install, scripts[name]).toBeGreaterThan(build);
    expect(tests, scripts[name]).toBeGreaterThan(install);
  });

  it('test:containers builds its image too, and runs test/major-files.txt, move-faults.test.ts (PostgreSQL 15 binaries) among them', () => {
    const list = steps('test:containers');
    expect(list).toContain('test/containers/ensure-image.sh');
    const run = list.find((step) => step.includes('vitest run'))!;
    expect(run).toMatch(/vitest run \$\(sed [^)]* test\/major-files\.txt\)$/);
    expect(majorFiles()).toContain('test/integration/move-faults.test.ts');
  });
});

/** test/major-files.txt without its comments: what test:containers and test:matrix run. */
function majorFiles(): string[] {
  return readFileSync(join(ROOT, 'test', 'major-files.txt'), 'utf8')
    .split('\n')
    .filter((line) => line !== '' && !line.startsWith('#'));
}

describe('test/major-files.txt (the files test:containers and test:matrix run)', () => {
  it('names integration files that exist, each once, and holds the core files test/matrix.sh gives some majors', () => {
    const files = majorFiles();
    expect(new Set(files).size).toBe(files.length);
    for (const file of files) {
      expect(file).toMatch(/^test\/integration\/[a-z0-9-]+\.test\.ts$/);
      expect(existsSync(join(ROOT, file)), file).toBe(true);
    }
    const matrix = readFileSync(join(ROOT, 'test', 'matrix.sh'), 'utf8');
    const core = /\ncore=\(\n([^)]*)\)/
      .exec(matrix)![1]!
      .split('\n')
      .map((line) => line.trim())
      .filter(Boolean);
    expect(core.length).toBeGreaterThanOrEqual(5);
    for (const file of core) expect(files, file).toContain(file);
  });
});
