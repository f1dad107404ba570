import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';

/**
 * The tree reads bottom-up (docs/architecture.md): a module imports only from its own layer or the
 * layers below it, and the CLI only from the package root.
 */
const LAYERS: readonly (readonly string[])[] = [
  ['errors.ts', 'text.ts', 'clock.ts', 'promises.ts', 'pg'],
  ['id'],
  ['config'],
  ['fleet'],
  ['migrations'],
  ['provisioning', 'moves', 'router', 'adopt'],
  ['commands', 'dev', 'adapters'],
  ['index.ts'],
  ['cli'],
];

const SRC = join(import.meta.dirname, '..', '..', 'src');

function layerOf(file: string): number {
  const top = relative(SRC, file).split('/')[0]!;
  const layer = LAYERS.findIndex((names) => names.includes(top));
  if (layer === -1)
    throw new Error(`${relative(SRC, file)} is in no layer: add its folder to LAYERS and docs/architecture.md`);
  return layer;
}

function sourceFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    return statSync(path).isDirectory() ? sourceFiles(path) : path.endsWith('.ts') ? [path] : [];
  });
}

function relativeImports(file: string): string[] {
  const text = readFileSync(file, 'utf8');
  return [...text.matchAll(/(?:from|import\(?)\s*'(\.{1,2}\/[^']+)'/g)].map((m) =>
    resolve(dirname(file), m[1]!.replace(/\.js$/, '.ts')),
  );
}

describe('source layers', () => {
  const files = sourceFiles(SRC);

  it('every source file belongs to a layer', () => {
    for (const file of files) expect(() => layerOf(file)).not.toThrow();
  });

  it('no module imports from a layer above its own', () => {
    const upward = files.flatMap((file) =>
      relativeImports(file)
        .filter((target) => layerOf(target) > layerOf(file))
        .map((target) => `${relative(SRC, file)} imports ${relative(SRC, target)}`),
    );
    expect(upward).toEqual([]);
  });

  it('the CLI imports only the package root (and its own modules)', () => {
    const inside = files
      .filter((file) => relative(SRC, file).startsWith('cli/'))
      .flatMap((file) =>
        relativeImports(file)
          .filter((target) => !relative(SRC, target).startsWith('cli/') && relative(SRC, target) !== 'index.ts')
          .map((target) => `${relative(SRC, file)} imports ${relative(SRC, target)}`),
      );
    expect(inside).toEqual([]);
  });

  it('the CLI loads the package root only when a command runs (src/cli/library.ts), never by a static import', () => {
    const eager = files
      .filter((file) => relative(SRC, file).startsWith('cli/'))
      .flatMap((file) =>
        [...readFileSync(file, 'utf8').matchAll(/^import (?!type )[^;]*from '\.\.\/index\.js';/gm)].map(
          (m) => `${relative(SRC, file)}: ${m[0]}`,
        ),
      );
    expect(eager).toEqual([]);
  });

  it.each(['router/connection.ts', 'router/replicas.ts', 'router/options.ts'])(
    '%s stands below router.ts: it imports nothing else of router/ (router.ts and the call paths use it)',
    (name) => {
      const file = join(SRC, name);
      expect(files).toContain(file);
      const inRouter = relativeImports(file)
        .filter((target) => relative(SRC, target).startsWith('router/'))
        .map((target) => relative(SRC, target));
      expect(inRouter).toEqual([]);
    },
  );

  it("the move's SQL builders (src/moves/sql/) import only SQL modules and the layers below moves/, never a step", () => {
    const steps = files
      .filter((file) => relative(SRC, file).startsWith('moves/sql/'))
      .flatMap((file) =>
        relativeImports(file)
          .filter(
            (target) => relative(SRC, target).startsWith('moves/') && !relative(SRC, target).startsWith('moves/sql/'),
          )
          .filter((target) => relative(SRC, target) !== 'moves/privileges.ts')
          .map((target) => `${relative(SRC, file)} imports ${relative(SRC, target)}`),
      );
    expect(steps).toEqual([]);
  });

  it("the move's SQL builders check integers and quote values only through the sql tag (src/pg/sql-template.ts)", () => {
    const byHand = files
      .filter((file) => relative(SRC, file).startsWith('moves/sql/') || relative(SRC, file) === 'moves/privileges.ts')
      .flatMap((file) =>
        [
          ...readFileSync(file, 'utf8').matchAll(
            /Number\.isInteger|quoteIdent|quoteLiteral|Math\.max\(1, Math\.round/g,
          ),
        ].map((m) => `${relative(SRC, file)}: ${m[0]}`),
      );
    expect(byHand).toEqual([]);
  });

  it.each(['moves', 'provisioning', 'fleet', 'router'])(
    'no import cycle inside %s/ (a file never reaches itself through its imports)',
    (folder) => {
      const inFolder = files.filter((file) => relative(SRC, file).startsWith(`${folder}/`));
      const edges = new Map(
        inFolder.map((file) => [file, relativeImports(file).filter((target) => inFolder.includes(target))]),
      );
      const cycles: string[] = [];
      const done = new Set<string>();
      const visit = (file: string, path: readonly string[]): void => {
        if (path.includes(file)) {
          cycles.push([...path.slice(path.indexOf(file)), file].map((f) => relative(SRC, f)).join(' -> '));
          return;
        }
        if (done.has(file)) return;
        for (const target of edges.get(file) ?? []) visit(target, [...path, file]);
        done.add(file);
      };
      for (const file of inFolder) visit(file, []);
      expect(cycles).toEqual([]);
    },
  );
});
