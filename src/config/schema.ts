/**
 * The config file's shape, declared once: validate.ts checks a file against it field by field,
 * types.ts takes the fields' types from it, and configJsonSchema() turns it into the JSON Schema
 * that editors and CI use (shipped as shardctl.schema.json, printed by `shardctl config schema`).
 *
 * Each check carries the message a person reads when it fails; validate.ts appends the value
 * ("…, got 0") and reports the first failing check of each field. What a JSON Schema cannot say
 * (a calendar date that exists, shards that overlap or are missing, ids that ran out) is checked
 * by refinements here or by validate.ts across fields; the JSON Schema is therefore looser than
 * parseConfig, never stricter.
 */
import * as z from 'zod';
import { DEFAULT_EPOCH_ISO } from '../id/layout.js';
import { DURATION, durationMs } from './duration.js';
import { MAX_SHARD_NUMBER } from './ranges.js';

const LOWER_IDENTIFIER = /^[a-z_][a-z0-9_]*$/;
export const HOST_NAME = /^[A-Za-z0-9][A-Za-z0-9_.-]*$/;
const ISO_TIMESTAMP = /^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2})(?::(\d{2})(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})$/;
/** Below this, connecting alone would time out on a healthy host. */
const MIN_HOST_TIMEOUT_MS = 100;

const DURATION_EXPECTED = 'must be a duration such as "500ms", "5s" or "1min"';
const URL_EXPECTED = 'must be a postgres:// connection URL';
const WEIGHT_EXPECTED = 'must be a positive number such as 1 or 2.5';
const EPOCH_EXPECTED = 'must be an ISO 8601 timestamp with Z or an offset, e.g. "2011-08-24T21:07:01.721Z"';

function integer(range: string, min: number, max = Number.MAX_SAFE_INTEGER) {
  const expected = `must be ${range}`;
  return z.int({ error: expected }).min(min, expected).max(max, expected);
}

function duration() {
  return z.string({ error: DURATION_EXPECTED }).regex(DURATION, DURATION_EXPECTED);
}

export const hostSchema = z.strictObject({
  name: z
    .string({ error: 'must be a string' })
    .min(1, 'must not be empty')
    .regex(HOST_NAME, 'must start with a letter or digit and contain only letters, digits, "_", "." and "-"')
    .describe('Unique name of the host, e.g. pg1; used in every message about it.'),
  url: z
    .string({ error: URL_EXPECTED })
    .describe('postgres:// connection URL; ${VAR} and ${VAR:-default} are read from the environment.'),
  replicationUrl: z
    .string({ error: URL_EXPECTED })
    .describe('How other hosts reach this one (logical replication during moves); default: url.')
    .optional(),
  shards: z
    .union([z.string(), z.number()], { error: 'must be a shard list such as "0-1023" or a shard number' })
    .describe('The shards on this host: ranges and lists such as "0-99,200,300-399", or "" for none.'),
  // Relative: a host of weight 2 gets twice the share of a host of weight 1 when rebalancing.
  weight: z
    .number({ error: WEIGHT_EXPECTED })
    .gt(0, WEIGHT_EXPECTED)
    .describe('Relative share of the shards when rebalancing.')
    .default(1),
  // Decommissioning: rebalance moves every shard off, and nothing moves onto it.
  drain: z
    .boolean({ error: 'must be true or false' })
    .describe('Being decommissioned: rebalance empties it and moves nothing onto it.')
    .default(false),
});

export const idLayoutSchema = z.strictObject({
  epoch: z
    .string({ error: 'must be an ISO 8601 timestamp string' })
    .regex(ISO_TIMESTAMP, EPOCH_EXPECTED)
    .refine(isCalendarDate, EPOCH_EXPECTED)
    .describe('The ids\' epoch (ISO 8601 with Z or an offset). Never change it after init.')
    .default(DEFAULT_EPOCH_ISO),
  shardBits: integer('an integer of at least 1', 1).describe('Bits of the shard number in an id. Never change it after init.').default(13),
  sequenceBits: integer('an integer of at least 1', 1).describe('Bits of the per-millisecond sequence. Never change it after init.').default(10),
});

export const configSchema = z
  .strictObject({
    schemaPrefix: z
      .string({ error: 'must be a string' })
      .regex(LOWER_IDENTIFIER, 'must be a lower-case identifier: a-z, 0-9 and _, not starting with a digit')
      .refine((prefix) => !prefix.startsWith('pg_'), 'must not start with "pg_" (reserved by PostgreSQL)')
      .describe('Shard schemas are <schemaPrefix>0 .. <schemaPrefix><shards-1>.')
      .default('insta'),
    shards: integer(`a whole number of shards from 1 to ${MAX_SHARD_NUMBER + 1}`, 1, MAX_SHARD_NUMBER + 1).describe(
      'Logical shard count. Never change it after init.',
    ),
    idLayout: idLayoutSchema.describe('The 64-bit id layout; the defaults are Instagram\'s. Never change it after init.').nullish(),
    migrations: z
      .string({ error: 'must be a folder path' })
      .min(1, 'must not be empty')
      .describe('Folder of NNNN_name.sql migration files, relative to this file.')
      .default('./migrations'),
    concurrency: integer('an integer from 1 to 64', 1, 64).describe('Connections per host for init, add-schema and migrate.').default(2),
    lockTimeout: duration()
      // 0 means "wait forever" to PostgreSQL: exactly what lockTimeout exists to prevent.
      .refine((value) => !/^0+(ms|s|min)$/.test(value), 'must be more than 0 (0 would wait forever)')
      .describe('lock_timeout of each migration on each shard.')
      .default('5s'),
    // How long a host may leave a statement unanswered before a fresh connection checks it is alive.
    hostTimeout: duration()
      .refine((value) => !DURATION.test(value) || durationMs(value) >= MIN_HOST_TIMEOUT_MS, 'must be at least 100ms')
      .describe('A host silent this long while a statement waits is checked over a new connection; at least 100ms.')
      .default('10s'),
    hosts: z
      .array(hostSchema, { error: 'must be a list of hosts' })
      .min(1, 'must list at least one host')
      .describe('The physical hosts; every shard is on exactly one of them.'),
    // Editors read it from JSON configs; shardctl ignores it.
    $schema: z.string({ error: 'must be a string' }).describe('The JSON Schema of this file, for editors.').optional(),
  })
  .meta({ title: 'shardctl config', description: 'The shard map and settings of a shardctl fleet (shardctl.yaml).' });

/** A config file as written: every field with a default may be left out. */
export type ConfigFile = z.input<typeof configSchema>;
/** A config file's fields once checked, defaults filled in. */
export type ConfigFields = z.output<typeof configSchema>;
export type HostFields = z.output<typeof hostSchema>;

/** The JSON Schema (draft 2020-12) of a config file as written. */
export function configJsonSchema(): Record<string, unknown> {
  return z.toJSONSchema(configSchema, { io: 'input', target: 'draft-2020-12' }) as Record<string, unknown>;
}

/** Date.parse rolls 2011-02-30 over into March; the round trip of the day catches that. */
function isCalendarDate(text: string): boolean {
  const match = ISO_TIMESTAMP.exec(text);
  if (!match || Number.isNaN(Date.parse(text))) return false;
  const [year, month, day] = [Number(match[1]), Number(match[2]), Number(match[3])];
  const calendar = new Date(0);
  calendar.setUTCFullYear(year, month - 1, day);
  return calendar.getUTCMonth() === month - 1 && calendar.getUTCDate() === day;
}
