import { readFileSync } from 'node:fs';
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

  it('test:containers builds its image too, and runs move-faults.test.ts (PostgreSQL 15 binaries) among its files', () => {
    const list = steps('test:containers');
    expect(list).toContain('test/containers/ensure-image.sh');
    const run = list.find((step) => step.includes('vitest run'))!;
    expect(run).toMatch(/vitest run test\/integration\b/);
    expect(run).not.toContain('move-faults');
  });
});
