import { shardsPhrase } from '../config/ranges.js';
import type { MigrationFile } from './files.js';
import { inflect, plural } from '../text.js';

/**
 * The one home of the migration rules: a shard's level, what is pending on it, and what is drift.
 * migrate, migrate --check, init, add-schema, status and move preflight all ask these functions,
 * so they cannot disagree about a shard.
 *
 * - A shard's level is the highest version applied to it.
 * - Pending: files above that level, not yet applied. They run in version order.
 * - Drift: an applied file that changed (checksum) or is gone, and a file below the level that was
 *   never applied (out of order: applying it now would run the files out of order). Drift is never
 *   pending; migrate refuses it (exit 3) and status reports it.
 */

/** version → checksum of the migrations applied to one shard. */
export type AppliedMigrations = ReadonlyMap<number, string>;

export type DriftKind = 'drift' | 'missing-file' | 'out-of-order';

export const DRIFT_KINDS: ReadonlySet<string> = new Set<DriftKind>(['drift', 'missing-file', 'out-of-order']);

/** A drift problem on one host, for one file, naming the shards it concerns. */
export interface DriftProblem {
  readonly kind: DriftKind;
  readonly host: string;
  readonly version: number;
  readonly shards: readonly number[];
  readonly message: string;
}

/** The highest version applied to a shard; 0 when none is. */
export function shardLevel(applied: AppliedMigrations | undefined): number {
  let level = 0;
  if (applied) for (const version of applied.keys()) if (version > level) level = version;
  return level;
}

/** Files that migrate would apply to a shard, in version order (out-of-order files are drift, not pending). */
export function pendingMigrations(
  applied: AppliedMigrations | undefined,
  files: readonly MigrationFile[],
): MigrationFile[] {
  const level = shardLevel(applied);
  return files.filter((m) => m.version > level && !applied?.has(m.version));
}

/** The highest level of any shard of any host; null when no shard has a migration. */
export function fleetLevel(appliedByHost: Iterable<ReadonlyMap<number, AppliedMigrations>>): number | null {
  let level: number | null = null;
  for (const applied of appliedByHost) {
    for (const versions of applied.values()) {
      const shard = shardLevel(versions);
      if (versions.size > 0 && (level === null || shard > level)) level = shard;
    }
  }
  return level;
}

/** Applied versions of one shard whose file changed or is gone (a move builds its target from the files). */
export function shardDrift(applied: AppliedMigrations, files: readonly MigrationFile[]): number[] {
  const byVersion = new Map(files.map((m) => [m.version, m]));
  return [...applied]
    .filter(([version, checksum]) => byVersion.get(version)?.checksum !== checksum)
    .map(([version]) => version);
}

/**
 * Every drift problem on one host. `applied`: shard → its applied migrations, for the shards whose
 * schema exists (records of a dropped schema are cleared when it is re-created); `names`: version →
 * file name as recorded, to name a deleted file.
 */
export function driftProblems(
  host: string,
  applied: ReadonlyMap<number, AppliedMigrations>,
  names: ReadonlyMap<number, string>,
  files: readonly MigrationFile[],
): DriftProblem[] {
  const byVersion = new Map(files.map((m) => [m.version, m]));
  const changed = new Map<number, number[]>();
  const missing = new Map<number, number[]>();
  const late = new Map<number, { shards: number[]; newest: number }>();
  const add = (bucket: Map<number, number[]>, version: number, shard: number): void => {
    let shards = bucket.get(version);
    if (!shards) bucket.set(version, (shards = []));
    shards.push(shard);
  };
  // Shards with the same applied migrations often share one map (see readHostSnapshot): each map
  // is judged once.
  const verdicts = new Map<
    AppliedMigrations,
    { missing: number[]; changed: number[]; late: number[]; level: number }
  >();
  const judge = (versions: AppliedMigrations) => {
    const verdict = {
      missing: [] as number[],
      changed: [] as number[],
      late: [] as number[],
      level: shardLevel(versions),
    };
    for (const [version, checksum] of versions) {
      const file = byVersion.get(version);
      if (!file) verdict.missing.push(version);
      else if (file.checksum !== checksum) verdict.changed.push(version);
    }
    for (const file of files) {
      if (file.version >= verdict.level) break;
      if (!versions.has(file.version)) verdict.late.push(file.version);
    }
    return verdict;
  };
  for (const [shard, versions] of applied) {
    let verdict = verdicts.get(versions);
    if (!verdict) verdicts.set(versions, (verdict = judge(versions)));
    for (const version of verdict.missing) add(missing, version, shard);
    for (const version of verdict.changed) add(changed, version, shard);
    for (const version of verdict.late) {
      let entry = late.get(version);
      if (!entry) late.set(version, (entry = { shards: [], newest: verdict.level }));
      entry.shards.push(shard);
      entry.newest = Math.max(entry.newest, verdict.level);
    }
  }
  const problems: DriftProblem[] = [];
  const on = (shards: number[]): string => {
    shards.sort((a, b) => a - b);
    return shardsPhrase(shards);
  };
  for (const [version, shards] of changed) {
    problems.push({
      kind: 'drift',
      host,
      version,
      shards,
      message: `host ${host}: ${byVersion.get(version)!.name}.sql changed after it was applied to ${on(shards)} (checksum differs); restore the file and put the change in a new migration`,
    });
  }
  for (const [version, shards] of missing) {
    const name = names.get(version);
    problems.push({
      kind: 'missing-file',
      host,
      version,
      shards,
      message: `host ${host}: ${name ? `${name}.sql (version ${version})` : `migration version ${version}`} is applied to ${on(shards)} but no file in the migrations folder has that version; restore it`,
    });
  }
  for (const [version, { shards, newest }] of late) {
    problems.push({
      kind: 'out-of-order',
      host,
      version,
      shards,
      message:
        `host ${host}: ${byVersion.get(version)!.name}.sql is not applied to ${on(shards)}, which already ` +
        `${inflect(shards.length, 'has', 'have')} version ${newest}; migrations run in version order, so give it a version above ${newest}`,
    });
  }
  return problems;
}

/** How far one file has got over a set of shards: `0004_views: 12 of 2048 shards`. */
export interface FileRollout {
  /** File name without `.sql`. */
  readonly name: string;
  readonly version: number;
  /** Shards with this file applied. */
  readonly applied: number;
  /** Shards looked at (those whose schema exists on the hosts that were read). */
  readonly shards: number;
}

/**
 * Per file, on how many of the given shards it is applied; only the files not yet on every one of
 * them (a fleet in the middle of a rollout, or with a file not started). `applied`: one entry per
 * shard whose schema exists.
 */
export function fileRollout(
  files: readonly MigrationFile[],
  applied: readonly (AppliedMigrations | undefined)[],
): FileRollout[] {
  const counts = new Map<number, number>();
  // Shards at the same level often share one map (see readHostSnapshot): count each map once.
  const byMap = new Map<AppliedMigrations | undefined, number>();
  for (const versions of applied) byMap.set(versions, (byMap.get(versions) ?? 0) + 1);
  for (const [versions, shards] of byMap) {
    if (versions) for (const version of versions.keys()) counts.set(version, (counts.get(version) ?? 0) + shards);
  }
  return files
    .map((file) => ({
      name: file.name,
      version: file.version,
      applied: counts.get(file.version) ?? 0,
      shards: applied.length,
    }))
    .filter((r) => r.applied < r.shards);
}

/** `0004_views: 12 of 2048 shards` per file, as status and migrate --check print a rollout. */
export function describeRollout(rollout: readonly FileRollout[]): string[] {
  return rollout.map((r) => `${r.name}: ${r.applied} of ${plural(r.shards, 'shard')}`);
}

/** A shard's shape as one fingerprint, with the migrations applied to it (see src/migrations/shape.ts). */
export interface ShardShape {
  readonly shard: number;
  readonly host: string;
  /** The versions applied, as a key: shards with the same migrations must have the same shape. */
  readonly level: string;
  readonly fingerprint: string;
}

export interface ShapeOutlier {
  readonly shard: number;
  /** A shard of the same migrations with the shape most of them have. */
  readonly reference: number;
}

/**
 * Hand-made drift: among shards with the same migrations applied, the shape most of them share is
 * what the migrations produce, and a shard with another shape was changed by hand. A group without
 * a strict majority (two shards that differ, or a tie) names nobody: there is no telling which is
 * right.
 */
export function shapeOutliers(shapes: readonly ShardShape[]): ShapeOutlier[] {
  const byLevel = new Map<string, Map<string, number[]>>();
  for (const s of shapes) {
    let level = byLevel.get(s.level);
    if (!level) byLevel.set(s.level, (level = new Map<string, number[]>()));
    let group = level.get(s.fingerprint);
    if (!group) level.set(s.fingerprint, (group = []));
    group.push(s.shard);
  }
  const outliers: ShapeOutlier[] = [];
  for (const groups of byLevel.values()) {
    if (groups.size < 2) continue;
    const sorted = [...groups.values()].sort((a, b) => b.length - a.length);
    if (sorted[0]!.length === sorted[1]!.length) continue;
    const reference = Math.min(...sorted[0]!);
    for (const group of sorted.slice(1)) for (const shard of group) outliers.push({ shard, reference });
  }
  return outliers.sort((a, b) => a.shard - b.shard);
}

/** A column of a shard table, its type without the shard's schema name. */
export interface ShapeColumn {
  readonly table: string;
  readonly column: string;
  readonly type: string;
}

/** What differs between a shard's columns and its reference's, naming the table and the column. */
export function describeShapeDifference(
  schema: string,
  mine: readonly ShapeColumn[],
  referenceSchema: string,
  reference: readonly ShapeColumn[],
): string[] {
  const key = (c: ShapeColumn): string => `${c.table}.${c.column}`;
  const theirs = new Map(reference.map((c) => [key(c), c]));
  const ours = new Map(mine.map((c) => [key(c), c]));
  const tables = new Set(reference.map((c) => c.table));
  const ourTables = new Set(mine.map((c) => c.table));
  const out: string[] = [];
  for (const t of ourTables) if (!tables.has(t)) out.push(`table ${schema}.${t} is not in ${referenceSchema}`);
  for (const t of tables) if (!ourTables.has(t)) out.push(`table ${t} of ${referenceSchema} is missing in ${schema}`);
  for (const c of mine) {
    if (!tables.has(c.table)) continue;
    const other = theirs.get(key(c));
    if (!other)
      out.push(`table ${schema}.${c.table} has a column ${c.column} (${c.type}) that ${referenceSchema} lacks`);
    else if (other.type !== c.type)
      out.push(`column ${schema}.${c.table}.${c.column} is ${c.type}, ${other.type} in ${referenceSchema}`);
  }
  for (const c of reference) {
    if (ourTables.has(c.table) && !ours.has(key(c)))
      out.push(`table ${schema}.${c.table} lacks the column ${c.column} (${c.type}) of ${referenceSchema}`);
  }
  if (out.length === 0) {
    const order = (cols: readonly ShapeColumn[]): string => cols.map(key).join(',');
    if (order(mine) !== order(reference))
      out.push(`the columns of ${schema} are in another order than in ${referenceSchema}`);
  }
  return out;
}
