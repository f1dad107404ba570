/**
 * Reads and validates the config map (shardctl.yaml). Every problem is collected and reported at
 * once in a single ConfigError, each naming the field and the offending value, so a broken file is
 * fixed in one pass instead of one error per run.
 */
import { statSync } from 'node:fs';
import { readFile, stat } from 'node:fs/promises';
import path from 'node:path';
import { LineCounter, parseDocument } from 'yaml';
import { ConfigError, type ConfigIssue } from '../errors.js';
import {
  DEFAULT_EPOCH_ISO,
  DEFAULT_ID_LAYOUT,
  describeLayout,
  formatUnixMs,
  layoutEndUnixMs,
  maxShards,
  timeBits,
  type IdLayout,
} from '../id/layout.js';
import { redactUrl } from '../pg/redact.js';
import { DURATION, durationMs } from './duration.js';
import { expandEnv, type Env } from './env.js';
import { Field, type Fields, type FieldValues, isAnything, isBoolean, isInteger, isList, isNumber, isString } from './fields.js';
import { formatShardList, MAX_SHARD_NUMBER, parseShardList } from './ranges.js';
import type { HostConfig, ShardctlConfig } from './types.js';

export const DEFAULT_CONFIG_FILE = 'shardctl.yaml';

export interface ParseConfigOptions {
  /** Where the text came from; relative paths (e.g. migrations) resolve against its folder. */
  file: string;
  /** Defaults to the file's extension: .json → JSON, anything else → YAML. */
  format?: 'yaml' | 'json';
  /** For ${VAR} in host URLs; defaults to process.env. */
  env?: Env;
  /** The moment the id layout is checked against; defaults to now. */
  now?: Date;
  /** Refuse a migrations folder that does not exist (default true). */
  checkMigrationsDir?: boolean;
  /** Resolves a relative `file`; defaults to process.cwd(). */
  cwd?: string;
}

export interface LoadConfigOptions {
  env?: Env;
  now?: Date;
  cwd?: string;
  checkMigrationsDir?: boolean;
}

/** The config file to read: the argument, else $SHARDCTL_CONFIG, else ./shardctl.yaml; absolute. */
export function resolveConfigPath(file?: string, env: Env = process.env, cwd: string = process.cwd()): string {
  const chosen = file || env['SHARDCTL_CONFIG'] || DEFAULT_CONFIG_FILE;
  return path.resolve(cwd, chosen);
}

export async function loadConfig(file?: string, options: LoadConfigOptions = {}): Promise<ShardctlConfig> {
  const env = options.env ?? process.env;
  const configPath = resolveConfigPath(file, env, options.cwd);
  let text: string;
  try {
    // stat first: opening a FIFO for reading would wait for a writer forever.
    const info = await stat(configPath);
    const refusal = info.isDirectory() ? undefined : notAConfigFile(configPath, info);
    if (refusal) throw new ConfigError(configPath, [{ path: '', message: refusal }]);
    text = await readFile(configPath, 'utf8');
  } catch (error) {
    if (error instanceof ConfigError) throw error;
    throw new ConfigError(configPath, [{ path: '', message: unreadableFileMessage(configPath, error) }]);
  }
  return parseConfig(text, { ...options, env, file: configPath });
}

/**
 * A map of thousands of shards is a few kilobytes; a config larger than this is a mistake, and
 * parsing it (YAML keeps every node) would take many times its size in memory.
 */
export const MAX_CONFIG_BYTES = 1024 * 1024;

function notAConfigFile(configPath: string, info: { isFile(): boolean; size: number }): string | undefined {
  if (!info.isFile()) return `config file ${configPath} is not a regular file (a FIFO, socket or device); pass the path of a file`;
  if (info.size > MAX_CONFIG_BYTES) return tooLarge(configPath, info.size);
  return undefined;
}

function tooLarge(file: string, bytes: number): string {
  return `config file ${file} is ${(bytes / 1024 / 1024).toFixed(1)} MiB; a config is at most ${MAX_CONFIG_BYTES / 1024 / 1024} MiB`;
}

export function parseConfig(text: string, options: ParseConfigOptions): ShardctlConfig {
  const file = options.file === INLINE ? INLINE : path.resolve(options.cwd ?? process.cwd(), options.file);
  const format = options.format ?? (file.toLowerCase().endsWith('.json') ? 'json' : 'yaml');
  const bytes = Buffer.byteLength(text);
  if (bytes > MAX_CONFIG_BYTES) throw new ConfigError(file, [{ path: '', message: tooLarge(file, bytes) }]);
  const parsed = format === 'json' ? parseJson(text) : parseYaml(text);
  if ('error' in parsed) throw new ConfigError(file, [{ path: '', message: parsed.error }]);
  const issues: ConfigIssue[] = [];
  const config = validateConfig(parsed.value, issues, {
    file,
    baseDir: file === INLINE ? (options.cwd ?? process.cwd()) : path.dirname(file),
    env: options.env ?? process.env,
    now: options.now ?? new Date(),
    checkMigrationsDir: options.checkMigrationsDir ?? true,
  });
  if (issues.length > 0 || !config) throw new ConfigError(file, issues);
  return config;
}

/** types.ts documents this as the file of a config parsed from a string without a path. */
const INLINE = '<inline>';

// ---------------------------------------------------------------------------------------------
// Reading the text

type Parsed = { value: unknown } | { error: string };

function parseYaml(text: string): Parsed {
  const lineCounter = new LineCounter();
  const document = parseDocument(text, { lineCounter, prettyErrors: false });
  const [first] = document.errors;
  if (first) {
    const { line, col } = lineCounter.linePos(first.pos[0]);
    return { error: `not valid YAML at line ${line}, column ${col}: ${first.message}` };
  }
  try {
    return { value: document.toJS() };
  } catch (error) {
    // e.g. an alias bomb: yaml refuses to expand more than 100 aliases
    return { error: `not valid YAML: ${(error as Error).message}` };
  }
}

function parseJson(text: string): Parsed {
  try {
    return { value: JSON.parse(text) };
  } catch (error) {
    const message = (error as Error).message;
    return { error: `not valid JSON${jsonErrorPosition(text, message)}: ${withoutQuotedText(message)}` };
  }
}

/** JSON.parse reports a character offset (Node 20) or a line and column (Node 22+), or nothing. */
function jsonErrorPosition(text: string, message: string): string {
  const lineColumn = /\(line (\d+) column (\d+)\)/.exec(message);
  if (lineColumn) return ` at line ${lineColumn[1]}, column ${lineColumn[2]}`;
  const offset = /at position (\d+)/.exec(message);
  if (!offset) return '';
  const before = text.slice(0, Number(offset[1])).split('\n');
  return ` at line ${before.length}, column ${(before.at(-1) ?? '').length + 1}`;
}

/** V8 quotes the text around the error, which may hold a password; keep only what it found wrong. */
function withoutQuotedText(message: string): string {
  return message
    .replace(/,? *(?:\.\.\.)?"[\s\S]*$/, '')
    .replace(/ in JSON at position \d+[\s\S]*$/, '')
    .replace(/ \(line \d+ column \d+\)/, '');
}

function unreadableFileMessage(configPath: string, error: unknown): string {
  const code = (error as NodeJS.ErrnoException).code;
  if (code === 'ENOENT') {
    return `config file ${configPath} does not exist (pass the path, or set SHARDCTL_CONFIG)`;
  }
  if (code === 'EISDIR') return `config file ${configPath} is a folder, not a file`;
  return `cannot read config file ${configPath}: ${(error as Error).message}`;
}

// ---------------------------------------------------------------------------------------------
// The fields, each with its own checks, so one bad field never hides the problems in another

const LOWER_IDENTIFIER = /^[a-z_][a-z0-9_]*$/;
const HOST_NAME = /^[A-Za-z0-9][A-Za-z0-9_.-]*$/;
const ISO_TIMESTAMP = /^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2})(?::(\d{2})(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})$/;
/** PostgreSQL silently truncates longer identifiers, so two shard schemas could collide. */
const MAX_IDENTIFIER_BYTES = 63;
const RUNWAY_WARNING_YEARS = 10;

function integerField(range: string, min: number, max = Number.MAX_SAFE_INTEGER): Field<number> {
  const expected = `must be ${range}`;
  return Field.of(isInteger, expected).min(min, expected).max(max, expected);
}

/** Below this, connecting alone would time out on a healthy host. */
const MIN_HOST_TIMEOUT_MS = 100;
const DURATION_EXPECTED = 'must be a duration such as "500ms", "5s" or "1min"';
const URL_EXPECTED = 'must be a postgres:// connection URL';
const WEIGHT_EXPECTED = 'must be a positive number such as 1 or 2.5';

const topLevelFields = {
  schemaPrefix: Field.of(isString, 'must be a string')
    .regex(LOWER_IDENTIFIER, 'must be a lower-case identifier: a-z, 0-9 and _, not starting with a digit')
    .refine((prefix) => !prefix.startsWith('pg_'), 'must not start with "pg_" (reserved by PostgreSQL)')
    .default('insta'),
  shards: integerField(`a whole number of shards from 1 to ${MAX_SHARD_NUMBER + 1}`, 1, MAX_SHARD_NUMBER + 1),
  idLayout: Field.of(isAnything, ''),
  migrations: Field.of(isString, 'must be a folder path').min(1, 'must not be empty').default('./migrations'),
  concurrency: integerField('an integer from 1 to 64', 1, 64).default(2),
  lockTimeout: Field.of(isString, DURATION_EXPECTED)
    .regex(DURATION, DURATION_EXPECTED)
    // 0 means "wait forever" to PostgreSQL: exactly what lockTimeout exists to prevent.
    .refine((value) => !/^0+(ms|s|min)$/.test(value), 'must be more than 0 (0 would wait forever)')
    .default('5s'),
  // How long a host may leave a statement unanswered before a fresh connection checks it is alive.
  hostTimeout: Field.of(isString, DURATION_EXPECTED)
    .regex(DURATION, DURATION_EXPECTED)
    .refine((value) => durationMs(value) >= MIN_HOST_TIMEOUT_MS, 'must be at least 100ms')
    .default('10s'),
  hosts: Field.of(isList, 'must be a list of hosts').min(1, 'must list at least one host'),
};

const idLayoutFields = {
  epoch: Field.of(isString, 'must be an ISO 8601 timestamp string')
    .refine(isIsoTimestamp, 'must be an ISO 8601 timestamp with Z or an offset, e.g. "2011-08-24T21:07:01.721Z"')
    .default(DEFAULT_EPOCH_ISO),
  shardBits: integerField('an integer of at least 1', 1).default(13),
  sequenceBits: integerField('an integer of at least 1', 1).default(10),
};

const hostFields = {
  name: Field.of(isString, 'must be a string')
    .min(1, 'must not be empty')
    .regex(HOST_NAME, 'must start with a letter or digit and contain only letters, digits, "_", "." and "-"'),
  url: Field.of(isString, URL_EXPECTED),
  replicationUrl: Field.of(isString, URL_EXPECTED).optional(),
  shards: Field.of((value): value is string | number => isString(value) || isNumber(value), 'must be a shard list such as "0-1023" or a shard number'),
  // Relative: a host of weight 2 gets twice the share of a host of weight 1 when rebalancing.
  weight: Field.of(isNumber, WEIGHT_EXPECTED).refine((weight) => weight > 0, WEIGHT_EXPECTED).default(1),
  // Decommissioning: rebalance moves every shard off, and nothing moves onto it.
  drain: Field.of(isBoolean, 'must be true or false').default(false),
};

/**
 * Checks one mapping: unknown keys (with a suggestion for typos) and each field on its own. Fields
 * that fail are left out of the result, so later checks can use whatever did pass.
 */
function readMapping<F extends Fields>(
  raw: unknown,
  at: string,
  fields: F,
  issues: ConfigIssue[],
): FieldValues<F> | undefined {
  const known = Object.keys(fields);
  if (!isMapping(raw)) {
    const subject = at === '' ? 'the config ' : '';
    const wanted = known.map((key) => JSON.stringify(key)).join(', ');
    issues.push({ path: at, message: `${subject}must be a mapping with the keys ${wanted}, got ${describeValue(raw)}` });
    return undefined;
  }
  for (const key of Object.keys(raw)) {
    if (!known.includes(key)) issues.push({ path: fieldPath(at, key), message: unknownKeyMessage(key, known) });
  }
  const values: Record<string, unknown> = {};
  for (const key of known) {
    const result = fields[key]!.parse(raw[key]);
    if (result.ok) values[key] = result.value;
    else issues.push({ path: fieldPath(at, key), message: fieldMessage(result.message, raw[key]) });
  }
  return values as FieldValues<F>;
}

function fieldMessage(message: string | undefined, value: unknown): string {
  return value === undefined ? 'is required' : `${message ?? 'is invalid'}, got ${describeValue(value)}`;
}

function unknownKeyMessage(key: string, known: readonly string[]): string {
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

interface ValidationContext {
  readonly file: string;
  readonly baseDir: string;
  readonly env: Env;
  readonly now: Date;
  readonly checkMigrationsDir: boolean;
}

/** Pushes every problem into `issues`; returns the config only when there are none. */
function validateConfig(raw: unknown, issues: ConfigIssue[], context: ValidationContext): ShardctlConfig | undefined {
  const top = readMapping(raw, '', topLevelFields, issues);
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
  const hosts = top.hosts === undefined ? undefined : readHosts(top.hosts, shards, issues, context.env, hostTimeoutMs ?? 0);

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
  const fields = readMapping(raw ?? {}, 'idLayout', idLayoutFields, issues);
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
    replicationUrl: host.replicationUrl ?? host.url!,
    shardsSpec: host.shardsSpec!,
    shards: host.shards!,
    weight: host.weight!,
    drain: host.drain!,
    timeoutMs,
  }));
}

function readHost(raw: unknown, index: number, issues: ConfigIssue[], env: Env): HostDraft {
  const at = `hosts[${index}]`;
  const fields = readMapping(raw, at, hostFields, issues);
  if (!fields) return { index };
  const url = fields.url === undefined ? undefined : readUrl(fields.url, `${at}.url`, env, issues);
  const replicationUrl =
    fields.replicationUrl === undefined ? undefined : readUrl(fields.replicationUrl, `${at}.replicationUrl`, env, issues);
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
  return { index, name: fields.name, url, replicationUrl, shardsSpec, shards, weight: fields.weight, drain: fields.drain };
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
  const origin = expanded.value === raw ? '' : ` (expanded from ${JSON.stringify(redactUrl(raw))})`;
  issues.push({ path: at, message: `${problem}${origin}` });
  return undefined;
}

function postgresUrlProblem(url: string): string | undefined {
  const quoted = JSON.stringify(redactUrl(url));
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    return `${quoted} is not a valid URL (expected postgres://user@host:5432/database)`;
  }
  if (parsed.protocol !== 'postgres:' && parsed.protocol !== 'postgresql:') {
    return `${quoted} is not a postgres:// or postgresql:// URL`;
  }
  return undefined;
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
        `${shardsPhrase(shards)} ${shards.length === 1 ? 'is' : 'are'} on both ${hostLabel(earlier)} and ` +
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
      `${shardsPhrase(outside)} of ${hostLabel(host)} ${outside.length === 1 ? 'is' : 'are'} out of range: ` +
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
      `${shardsPhrase(unmapped)} ${unmapped.length === 1 ? 'is' : 'are'} on no host; ` +
      `every shard ${allShards(shardCount)} must be on exactly one host`,
  });
}

function hostLabel(host: HostDraft): string {
  return host.name === undefined ? `hosts[${host.index}]` : `host ${JSON.stringify(host.name)} (hosts[${host.index}])`;
}

function allShards(shardCount: number): string {
  return shardCount === 1 ? '0' : `0-${shardCount - 1}`;
}

function shardsPhrase(shards: readonly number[]): string {
  return shards.length === 1 ? `shard ${shards[0]}` : `shards ${formatShardList(shards)}`;
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
  return JSON.stringify(value) ?? String(value);
}

/** Date.parse rolls 2011-02-30 over into March; the round trip of the day catches that. */
function isIsoTimestamp(text: string): boolean {
  const match = ISO_TIMESTAMP.exec(text);
  if (!match || Number.isNaN(Date.parse(text))) return false;
  const [year, month, day] = [Number(match[1]), Number(match[2]), Number(match[3])];
  const calendar = new Date(0);
  calendar.setUTCFullYear(year, month - 1, day);
  return calendar.getUTCMonth() === month - 1 && calendar.getUTCDate() === day;
}

function addYears(date: Date, years: number): Date {
  const later = new Date(date.getTime());
  later.setUTCFullYear(later.getUTCFullYear() + years);
  return later;
}

function yearsOf(ms: bigint): string {
  return (Number(ms) / (365.25 * 24 * 3600 * 1000)).toFixed(1);
}
