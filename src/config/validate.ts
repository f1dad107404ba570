/**
 * Checks a config value (YAML or JSON, already parsed) against the schema (schema.ts), then across
 * fields. Every problem is collected, each naming the field and the offending value; a field that
 * fails is left out of what the later checks see, so one bad field never hides the problems in
 * another (a bad host name still lets the shard map be checked for gaps and overlaps).
 */
import { statSync } from 'node:fs';
import path from 'node:path';
import type * as z from 'zod/mini';
import { UsageError, type ConfigIssue } from '../errors.js';
import {
  DEFAULT_ID_LAYOUT,
  describeLayout,
  formatUnixMs,
  layoutEndUnixMs,
  maxShards,
  timeBits,
  type IdLayout,
} from '../id/layout.js';
import { forServerLibpq, parsePostgresUrl, serverKey, serverKeys } from '../pg/multihost.js';
import { redactUrl } from '../pg/redact.js';
import { durationMs } from './duration.js';
import { expandEnv, type Env } from './env.js';
import { parseShardList, shardsPhrase } from './ranges.js';
import { configSchema, hostSchema, idLayoutSchema } from './schema.js';
import type { HostConfig, ShardctlConfig } from './types.js';
import { inflect } from '../text.js';

/** PostgreSQL silently truncates longer identifiers, so two shard schemas could collide. */
const MAX_IDENTIFIER_BYTES = 63;
const RUNWAY_WARNING_YEARS = 10;

// ---------------------------------------------------------------------------------------------
// One mapping against its schema

type AnyObject = z.ZodMiniObject;
type Values<S extends AnyObject> = { [K in keyof z.output<S>]?: z.output<S>[K] };

/**
 * Checks one mapping: unknown keys (with a suggestion for typos) and each field on its own, the
 * first failing check of a field reported. A field that is itself a mapping or a list of mappings
 * is checked here only as a whole (its type, the list's length); its value is returned as written
 * for the caller to read with readMapping in turn, so every problem inside it has its own path.
 */
function readMapping<S extends AnyObject>(
  raw: unknown,
  at: string,
  schema: S,
  issues: ConfigIssue[],
): Values<S> | undefined {
  const known = Object.keys(schema.shape);
  if (!isMapping(raw)) {
    const subject = at === '' ? 'the config ' : '';
    const wanted = known.map((key) => JSON.stringify(key)).join(', ');
    issues.push({
      path: at,
      message: `${subject}must be a mapping with the keys ${wanted}, got ${describeValue(raw)}`,
    });
    return undefined;
  }
  for (const key of Object.keys(raw)) {
    if (!known.includes(key)) issues.push({ path: fieldPath(at, key), message: unknownKeyMessage(key, known) });
  }
  const values: Record<string, unknown> = {};
  for (const key of known) {
    const field = schema.shape[key] as z.ZodMiniType;
    const value = raw[key];
    const kind = containerKind(field);
    if (kind === 'mapping' && (value === undefined || value === null)) {
      if (field.safeParse(value).success) values[key] = value;
      else issues.push({ path: fieldPath(at, key), message: fieldMessage(undefined, value) });
      continue;
    }
    if (kind === 'mapping') {
      values[key] = value;
      continue;
    }
    const result = field.safeParse(value);
    if (result.success) {
      values[key] = kind === 'list' ? value : result.data;
      continue;
    }
    // A list's own checks (its type, its length) have an empty path; its items' have more.
    const own = result.error.issues.find((issue) => issue.path.length === 0);
    if (own) issues.push({ path: fieldPath(at, key), message: fieldMessage(own.message, value) });
    else values[key] = value;
  }
  return values as Values<S>;
}

/** 'mapping' for an object field, 'list' for a list of them, looking through optional and default. */
function containerKind(field: z.ZodMiniType): 'mapping' | 'list' | 'value' {
  let def = field._zod.def as { type: string; innerType?: z.ZodMiniType; element?: z.ZodMiniType };
  while (def.innerType && (def.type === 'optional' || def.type === 'nullable' || def.type === 'default')) {
    def = def.innerType._zod.def as typeof def;
  }
  if (def.type === 'object') return 'mapping';
  if (def.type === 'array' && def.element && containerKind(def.element) === 'mapping') return 'list';
  return 'value';
}

function fieldMessage(message: string | undefined, value: unknown): string {
  return value === undefined ? 'is required' : `${message ?? 'is invalid'}, got ${describeValue(value)}`;
}

/**
 * Refuses what is not an options object, and a key it does not have: from JavaScript or JSON a
 * misspelt option (`statementTimeout`, `readonly`) would otherwise be ignored, and the call would
 * run without it. A UsageError naming the key and the one it most likely meant.
 */
export function refuseUnknownOptions(what: string, options: unknown, known: readonly string[]): void {
  if (typeof options !== 'object' || options === null || Array.isArray(options))
    throw new UsageError(
      `must be an object of options, not ${Array.isArray(options) ? 'an array' : options === null ? 'null' : typeof options}`,
      { input: what },
    );
  for (const key in options)
    if (!known.includes(key)) throw new UsageError(unknownKeyMessage(key, known), { input: what });
}

/**
 * The keys of an options type as a list, from an object that names each once: the compiler refuses
 * the object when a key of T is missing or one is not T's, so the list cannot drift from the type.
 */
export function optionKeys<T>(keys: { readonly [K in keyof Required<T>]: true }): readonly string[] {
  return Object.keys(keys);
}

/**
 * `unknown key "poolsize" (did you mean "poolSize"?)`: for a key a config or an options object does
 * not have, with the known key it most likely meant, else the list of known keys.
 */
export function unknownKeyMessage(key: string, known: readonly string[]): string {
  const suggestion = closestKey(key, known);
  const hint = suggestion ? `did you mean "${suggestion}"?` : `expected one of ${known.join(', ')}`;
  return `unknown key ${JSON.stringify(key)} (${hint})`;
}

/** The known key a typo most likely meant: same letters ignoring case and _/-, or an edit or two away. */
function closestKey(key: string, known: readonly string[]): string | undefined {
  const squash = (text: string) => text.toLowerCase().replace(/[_-]/g, '');
  const sameLetters = known.find((candidate) => squash(candidate) === squash(key));
  if (sameLetters) return sameLetters;
  const ranked = known
    .map((candidate) => ({ candidate, distance: editDistance(squash(key), squash(candidate)) }))
    .filter(({ candidate, distance }) => distance <= Math.min(2, Math.floor(candidate.length / 3)))
    .sort((a, b) => a.distance - b.distance);
  const [best, runnerUp] = ranked;
  return best && best.distance !== runnerUp?.distance ? best.candidate : undefined;
}

function editDistance(a: string, b: string): number {
  let previous = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const current = [i];
    for (let j = 1; j <= b.length; j++) {
      const substitution = previous[j - 1]! + (a[i - 1] === b[j - 1] ? 0 : 1);
      current.push(Math.min(previous[j]! + 1, current[j - 1]! + 1, substitution));
    }
    previous = current;
  }
  return previous[b.length]!;
}

// ---------------------------------------------------------------------------------------------
// Checks across fields

export interface ValidationContext {
  readonly file: string;
  readonly baseDir: string;
  readonly env: Env;
  readonly now: Date;
  readonly checkMigrationsDir: boolean;
}

/** Pushes every problem into `issues`; returns the config only when there are none. */
export function validateConfig(
  raw: unknown,
  issues: ConfigIssue[],
  context: ValidationContext,
): ShardctlConfig | undefined {
  const top = readMapping(raw, '', configSchema, issues);
  if (!top) return undefined;
  const warnings: string[] = [];
  const layout = readIdLayout(top.idLayout, issues, warnings, context.now);
  const { shards, schemaPrefix } = top;
  if (shards !== undefined && layout.shardCapacity !== undefined && shards > layout.shardCapacity) {
    issues.push({
      path: 'shards',
      message:
        `${shards} shards do not fit in idLayout.shardBits ${layout.shardBits}, ` +
        `which allows at most ${layout.shardCapacity} shards`,
    });
  }
  if (schemaPrefix !== undefined && shards !== undefined) checkSchemaNameLength(schemaPrefix, shards, issues);
  const migrationsDir = top.migrations === undefined ? undefined : path.resolve(context.baseDir, top.migrations);
  if (migrationsDir !== undefined && context.checkMigrationsDir) checkMigrationsDir(migrationsDir, issues);
  const hostTimeoutMs = top.hostTimeout === undefined ? undefined : durationMs(top.hostTimeout);
  const hosts =
    top.hosts === undefined
      ? undefined
      : readHosts(top.hosts as unknown[], shards, issues, context.env, hostTimeoutMs ?? 0);

  if (issues.length > 0) return undefined;
  return {
    file: context.file,
    schemaPrefix: schemaPrefix!,
    shards: shards!,
    idLayout: layout.idLayout!,
    epochIso: layout.epochIso!,
    migrationsDir: migrationsDir!,
    hosts: hosts!,
    concurrency: top.concurrency!,
    lockTimeout: top.lockTimeout!,
    hostTimeout: top.hostTimeout!,
    warnings,
  };
}

interface LayoutResult {
  idLayout?: IdLayout;
  epochIso?: string;
  /** Known whenever shardBits itself is valid, so the shard count is checked even if the rest is not. */
  shardBits?: number;
  shardCapacity?: number;
}

function readIdLayout(raw: unknown, issues: ConfigIssue[], warnings: string[], now: Date): LayoutResult {
  const fields = readMapping(raw ?? {}, 'idLayout', idLayoutSchema, issues);
  const { epoch, shardBits, sequenceBits } = fields ?? {};
  if (shardBits === undefined) return {};
  const capacity = { shardBits, shardCapacity: maxShards({ ...DEFAULT_ID_LAYOUT, shardBits }) };
  if (sequenceBits === undefined) return capacity;
  if (shardBits + sequenceBits > 62) {
    issues.push({
      path: 'idLayout',
      message:
        `shardBits ${shardBits} + sequenceBits ${sequenceBits} leave no bits for the time ` +
        `(a 64-bit id has 63 usable bits; keep shardBits + sequenceBits at most 62)`,
    });
    return capacity;
  }
  if (epoch === undefined) return capacity;
  const idLayout: IdLayout = { epochMs: BigInt(Date.parse(epoch)), shardBits, sequenceBits };
  const nowMs = BigInt(now.getTime());
  if (idLayout.epochMs > nowMs) {
    issues.push({
      path: 'idLayout.epoch',
      message: `${JSON.stringify(epoch)} is in the future (now is ${now.toISOString()}); ids before it cannot be made`,
    });
  }
  const endMs = layoutEndUnixMs(idLayout);
  if (endMs <= nowMs) {
    issues.push({
      path: 'idLayout',
      message:
        `ids ran out on ${formatUnixMs(endMs)} (${describeLayout(idLayout)}); ` +
        `choose a later epoch or fewer shard/sequence bits`,
    });
  } else if (endMs <= BigInt(addYears(now, RUNWAY_WARNING_YEARS).getTime())) {
    warnings.push(
      `idLayout: ids run out on ${formatUnixMs(endMs)} (within ${RUNWAY_WARNING_YEARS} years); ` +
        `${describeLayout(idLayout)} covers ${yearsOf(1n << BigInt(timeBits(idLayout)))} years from the epoch`,
    );
  }
  return { ...capacity, idLayout, epochIso: epoch };
}

function checkSchemaNameLength(schemaPrefix: string, shards: number, issues: ConfigIssue[]): void {
  const longest = `${schemaPrefix}${shards - 1}`;
  const bytes = Buffer.byteLength(longest, 'utf8');
  if (bytes > MAX_IDENTIFIER_BYTES) {
    issues.push({
      path: 'schemaPrefix',
      message:
        `${JSON.stringify(schemaPrefix)} is too long: the last shard's schema ${JSON.stringify(longest)} has ` +
        `${bytes} bytes, and PostgreSQL identifiers are at most ${MAX_IDENTIFIER_BYTES}`,
    });
  }
}

function checkMigrationsDir(dir: string, issues: ConfigIssue[]): void {
  const stats = statSync(dir, { throwIfNoEntry: false });
  if (!stats) issues.push({ path: 'migrations', message: `folder ${dir} does not exist` });
  else if (!stats.isDirectory()) issues.push({ path: 'migrations', message: `${dir} is not a folder` });
}

// ---------------------------------------------------------------------------------------------
// Hosts and the shard map

interface HostDraft {
  readonly index: number;
  readonly name?: string;
  readonly url?: string;
  readonly directUrl?: string;
  readonly replicationUrl?: string;
  readonly shardsSpec?: string;
  readonly shards?: readonly number[];
  readonly weight?: number;
  readonly drain?: boolean;
}

function readHosts(
  rawHosts: readonly unknown[],
  shardCount: number | undefined,
  issues: ConfigIssue[],
  env: Env,
  timeoutMs: number,
): HostConfig[] | undefined {
  const issuesBefore = issues.length;
  const drafts = rawHosts.map((raw, index) => readHost(raw, index, issues, env));
  checkUniqueNames(drafts, issues);
  checkDistinctDatabases(drafts, issues);
  checkOverlaps(drafts, issues);
  checkSomeHostTakesShards(drafts, issues);
  if (shardCount !== undefined) {
    for (const host of drafts) checkInRange(host, shardCount, issues);
    if (drafts.every((host) => host.shards !== undefined)) checkEveryShardMapped(drafts, shardCount, issues);
  }
  if (issues.length > issuesBefore) return undefined;
  return drafts.map((host) => ({
    name: host.name!,
    url: host.url!,
    directUrl: host.directUrl ?? host.url!,
    replicationUrl: forServerLibpq(host.replicationUrl ?? host.directUrl ?? host.url!),
    shardsSpec: host.shardsSpec!,
    shards: host.shards!,
    weight: host.weight!,
    drain: host.drain!,
    timeoutMs,
  }));
}

function readHost(raw: unknown, index: number, issues: ConfigIssue[], env: Env): HostDraft {
  const at = `hosts[${index}]`;
  const fields = readMapping(raw, at, hostSchema, issues);
  if (!fields) return { index };
  const url = fields.url === undefined ? undefined : readUrl(fields.url, `${at}.url`, env, issues);
  const directUrl =
    fields.directUrl === undefined ? undefined : readUrl(fields.directUrl, `${at}.directUrl`, env, issues);
  const replicationUrl =
    fields.replicationUrl === undefined
      ? undefined
      : readUrl(fields.replicationUrl, `${at}.replicationUrl`, env, issues);
  const shardsSpec = fields.shards === undefined ? undefined : String(fields.shards);
  let shards: readonly number[] | undefined;
  if (shardsSpec !== undefined && shardsSpec.trim() === '') {
    // A host with no shards yet (a new host shards are about to move to) or any more (all moved away).
    shards = [];
  } else if (shardsSpec !== undefined) {
    const parsed = parseShardList(shardsSpec);
    if ('error' in parsed) issues.push({ path: `${at}.shards`, message: parsed.error });
    else shards = parsed.shards;
  }
  return {
    index,
    name: fields.name,
    url,
    directUrl,
    replicationUrl,
    shardsSpec,
    shards,
    weight: fields.weight,
    drain: fields.drain,
  };
}

/** Expands ${VAR} and checks the result is a postgres URL; every quoted URL is redacted. */
function readUrl(raw: string, at: string, env: Env, issues: ConfigIssue[]): string | undefined {
  const expanded = expandEnv(raw, env);
  if ('error' in expanded) {
    issues.push({ path: at, message: `${expanded.error} (in ${JSON.stringify(redactUrl(raw))})` });
    return undefined;
  }
  const problem = postgresUrlProblem(expanded.value);
  if (problem === undefined) return expanded.value;
  const origin = expanded.value === raw || /\s/.test(raw) ? '' : ` (expanded from ${JSON.stringify(redactUrl(raw))})`;
  issues.push({ path: at, message: `${problem}${origin}` });
  return undefined;
}

function postgresUrlProblem(url: string): string | undefined {
  try {
    // One address or several (libpq's multi-host syntax, src/pg/multihost.ts).
    parsePostgresUrl(url);
  } catch (error) {
    // A URL with whitespace is not shown at all: a password is hidden only up to a space.
    if (error instanceof UsageError)
      return /\s/.test(url) ? error.reason : `${JSON.stringify(redactUrl(url))} ${error.reason}`;
    throw error;
  }
  return undefined;
}

/**
 * Two hosts whose url reaches the same server and database are one database under two names: the
 * shards of both would be one set of schemas, and each run would wait on its own lock.
 */
function checkDistinctDatabases(hosts: readonly HostDraft[], issues: ConfigIssue[]): void {
  const firstIndex = new Map<string, HostDraft>();
  for (const host of hosts) {
    // Without a database in the URL, the database is the user's name (or PGDATABASE's): not compared.
    // Address by address: a URL of several addresses that lists another host's server and database
    // would send this host's calls there whenever that address is the one that answers.
    const keys = host.url === undefined ? [] : serverKeys(host.url, { requireDatabase: true });
    const earlier = keys.map((key) => firstIndex.get(key)).find((h) => h !== undefined && h !== host);
    if (earlier !== undefined) {
      const whole = host.url !== undefined && serverKey(host.url) === serverKey(earlier.url ?? '');
      issues.push({
        path: `hosts[${host.index}].url`,
        message: whole
          ? `reaches the same server and database as ${hostLabel(earlier)}; each host of the map is a database of its own`
          : `lists an address and database of ${hostLabel(earlier)}'s url; each host of the map is a database of its own, and a host's call must never reach another's`,
      });
      continue;
    }
    for (const key of keys) if (!firstIndex.has(key)) firstIndex.set(key, host);
  }
}

function checkUniqueNames(hosts: readonly HostDraft[], issues: ConfigIssue[]): void {
  // Compared ignoring case: "pg1" and "PG1" in one map is a mistake, and reads as one host in messages.
  const firstIndex = new Map<string, number>();
  for (const host of hosts) {
    if (host.name === undefined) continue;
    const key = host.name.toLowerCase();
    const earlier = firstIndex.get(key);
    if (earlier === undefined) firstIndex.set(key, host.index);
    else {
      issues.push({
        path: `hosts[${host.index}].name`,
        message: `${JSON.stringify(host.name)} is already the name of hosts[${earlier}]; host names must be unique`,
      });
    }
  }
}

function checkOverlaps(hosts: readonly HostDraft[], issues: ConfigIssue[]): void {
  const owner = new Map<number, HostDraft>();
  const shared = new Map<string, { earlier: HostDraft; later: HostDraft; shards: number[] }>();
  for (const host of hosts) {
    for (const shard of host.shards ?? []) {
      const earlier = owner.get(shard);
      if (earlier === undefined) {
        owner.set(shard, host);
        continue;
      }
      const key = `${earlier.index}/${host.index}`;
      const pair = shared.get(key) ?? { earlier, later: host, shards: [] };
      pair.shards.push(shard);
      shared.set(key, pair);
    }
  }
  for (const { earlier, later, shards } of shared.values()) {
    issues.push({
      path: `hosts[${later.index}].shards`,
      message:
        `${shardsPhrase(shards)} ${inflect(shards.length, 'is', 'are')} on both ${hostLabel(earlier)} and ` +
        `${hostLabel(later)}; every shard must be on exactly one host`,
    });
  }
}

/** Every host draining leaves nowhere for the shards to go: a map no rebalance can satisfy. */
function checkSomeHostTakesShards(hosts: readonly HostDraft[], issues: ConfigIssue[]): void {
  if (hosts.length === 0 || !hosts.every((host) => host.drain === true)) return;
  issues.push({ path: 'hosts', message: `every host has drain: true; at least one must keep taking shards` });
}

function checkInRange(host: HostDraft, shardCount: number, issues: ConfigIssue[]): void {
  const outside = (host.shards ?? []).filter((shard) => shard >= shardCount);
  if (outside.length === 0) return;
  issues.push({
    path: `hosts[${host.index}].shards`,
    message:
      `${shardsPhrase(outside)} of ${hostLabel(host)} ${inflect(outside.length, 'is', 'are')} out of range: ` +
      `shards is ${shardCount}, so shards are numbered ${allShards(shardCount)}`,
  });
}

function checkEveryShardMapped(hosts: readonly HostDraft[], shardCount: number, issues: ConfigIssue[]): void {
  const mapped = new Uint8Array(shardCount);
  for (const host of hosts) for (const shard of host.shards ?? []) if (shard < shardCount) mapped[shard] = 1;
  const unmapped: number[] = [];
  for (let shard = 0; shard < shardCount; shard++) if (!mapped[shard]) unmapped.push(shard);
  if (unmapped.length === 0) return;
  issues.push({
    path: 'hosts',
    message:
      `${shardsPhrase(unmapped)} ${inflect(unmapped.length, 'is', 'are')} on no host; ` +
      `every shard ${allShards(shardCount)} must be on exactly one host`,
  });
}

function hostLabel(host: HostDraft): string {
  return host.name === undefined ? `hosts[${host.index}]` : `host ${JSON.stringify(host.name)} (hosts[${host.index}])`;
}

function allShards(shardCount: number): string {
  return shardCount === 1 ? '0' : `0-${shardCount - 1}`;
}

// ---------------------------------------------------------------------------------------------
// Small helpers

function isMapping(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function fieldPath(at: string, key: string): string {
  return at === '' ? key : `${at}.${key}`;
}

function describeValue(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'a list';
  if (typeof value === 'object') return 'a mapping';
  // JSON.stringify would print Infinity and NaN (.inf, .nan in YAML) as null.
  if (typeof value === 'number' && !Number.isFinite(value)) return String(value);
  // eslint-disable-next-line @typescript-eslint/no-base-to-string -- objects returned above; what is left is a primitive
  return JSON.stringify(value) ?? String(value);
}

function addYears(date: Date, years: number): Date {
  const later = new Date(date.getTime());
  later.setUTCFullYear(later.getUTCFullYear() + years);
  return later;
}

function yearsOf(ms: bigint): string {
  return (Number(ms) / (365.25 * 24 * 3600 * 1000)).toFixed(1);
}
