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
import * as z from 'zod/mini';
import { DEFAULT_EPOCH_ISO } from '../id/layout.js';
import { DURATION, durationMs } from './duration.js';
import { MAX_SHARD_NUMBER } from './ranges.js';

const LOWER_IDENTIFIER = /^[a-z_][a-z0-9_]*$/;
export const HOST_NAME = /^[A-Za-z0-9][A-Za-z0-9_.-]*$/;
/** What HOST_NAME asks for, in the words of every message that refuses a host name. */
export const HOST_NAME_EXPECTED =
  'must start with a letter or digit and contain only letters, digits, "_", "." and "-"';
const ISO_TIMESTAMP = /^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2})(?::(\d{2})(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})$/;
/** Below this, connecting alone would time out on a healthy host. */
const MIN_HOST_TIMEOUT_MS = 100;

const DURATION_EXPECTED = 'must be a duration such as "500ms", "5s" or "1min"';
const URL_EXPECTED = 'must be a postgres:// connection URL';
const WEIGHT_EXPECTED = 'must be a positive number such as 1 or 2.5';
const EPOCH_EXPECTED = 'must be an ISO 8601 timestamp with Z or an offset, e.g. "2011-08-24T21:07:01.721Z"';

// zod/mini rather than zod: the same checks and JSON Schema, and in the CLI's bundle about a third
// of the code to compile on every command (only the checks used here are bundled).

function integer(range: string, min: number, max = Number.MAX_SAFE_INTEGER) {
  const expected = `must be ${range}`;
  return z.int({ error: expected }).check(z.gte(min, expected), z.lte(max, expected));
}

function duration(...checks: Parameters<ReturnType<typeof z.string>['check']>) {
  return z.string({ error: DURATION_EXPECTED }).check(z.regex(DURATION, DURATION_EXPECTED), ...checks);
}

export const hostSchema = z.strictObject({
  name: z
    .string({ error: 'must be a string' })
    .check(
      z.minLength(1, 'must not be empty'),
      z.regex(HOST_NAME, HOST_NAME_EXPECTED),
      z.describe('Unique name of the host, e.g. pg1; used in every message about it.'),
    ),
  url: z
    .string({ error: URL_EXPECTED })
    .check(
      z.describe(
        'postgres:// connection URL, or several addresses in libpq syntax (postgres://u@h1:5432,h2:5432/db?target_session_attrs=read-write) for a primary and its standbys; ${VAR} and ${VAR:-default} are read from the environment.',
      ),
    ),
  directUrl: z.optional(
    z
      .string({ error: URL_EXPECTED })
      .check(
        z.describe(
          'The server itself when url goes through a transaction pooler (PgBouncer): moves (their replication connection and sessions) connect here; default: url. ${VAR} as in url.',
        ),
      ),
  ),
  replicationUrl: z.optional(
    z
      .string({ error: URL_EXPECTED })
      .check(
        z.describe('How other hosts reach this one (logical replication during moves); default: directUrl, else url.'),
      ),
  ),
  shards: z
    .union([z.string(), z.number()], { error: 'must be a shard list such as "0-1023" or a shard number' })
    .check(z.describe('The shards on this host: ranges and lists such as "0-99,200,300-399", or "" for none.')),
  // Relative: a host of weight 2 gets twice the share of a host of weight 1 when rebalancing.
  weight: z._default(
    z
      .number({ error: WEIGHT_EXPECTED })
      .check(z.gt(0, WEIGHT_EXPECTED), z.describe('Relative share of the shards when rebalancing.')),
    1,
  ),
  // Decommissioning: rebalance moves every shard off, and nothing moves onto it.
  drain: z._default(
    z
      .boolean({ error: 'must be true or false' })
      .check(z.describe('Being decommissioned: rebalance empties it and moves nothing onto it.')),
    false,
  ),
});

export const idLayoutSchema = z.strictObject({
  epoch: z._default(
    z
      .string({ error: 'must be an ISO 8601 timestamp string' })
      .check(
        z.regex(ISO_TIMESTAMP, EPOCH_EXPECTED),
        z.refine(isCalendarDate, EPOCH_EXPECTED),
        z.describe("The ids' epoch (ISO 8601 with Z or an offset). Never change it after init."),
      ),
    DEFAULT_EPOCH_ISO,
  ),
  shardBits: z._default(
    integer('an integer of at least 1', 1).check(
      z.describe('Bits of the shard number in an id. Never change it after init.'),
    ),
    13,
  ),
  sequenceBits: z._default(
    integer('an integer of at least 1', 1).check(
      z.describe('Bits of the per-millisecond sequence. Never change it after init.'),
    ),
    10,
  ),
});

export const configSchema = z
  .strictObject({
    schemaPrefix: z._default(
      z.string({ error: 'must be a string' }).check(
        z.regex(LOWER_IDENTIFIER, 'must be a lower-case identifier: a-z, 0-9 and _, not starting with a digit'),
        z.refine((prefix) => !prefix.startsWith('pg_'), 'must not start with "pg_" (reserved by PostgreSQL)'),
        z.describe('Shard schemas are <schemaPrefix>0 .. <schemaPrefix><shards-1>.'),
      ),
      'insta',
    ),
    shards: integer(`a whole number of shards from 1 to ${MAX_SHARD_NUMBER + 1}`, 1, MAX_SHARD_NUMBER + 1).check(
      z.describe('Logical shard count. Never change it after init.'),
    ),
    idLayout: z.nullish(
      idLayoutSchema.check(
        z.describe("The 64-bit id layout; the defaults are Instagram's. Never change it after init."),
      ),
    ),
    migrations: z._default(
      z
        .string({ error: 'must be a folder path' })
        .check(
          z.minLength(1, 'must not be empty'),
          z.describe('Folder of NNNN_name.sql migration files, relative to this file.'),
        ),
      './migrations',
    ),
    concurrency: z._default(
      integer('an integer from 1 to 64', 1, 64).check(
        z.describe('Connections per host for init, add-schema and migrate.'),
      ),
      2,
    ),
    lockTimeout: z._default(
      duration(
        // 0 means "wait forever" to PostgreSQL: exactly what lockTimeout exists to prevent.
        z.refine((value) => !/^0+(ms|s|min)$/.test(value), 'must be more than 0 (0 would wait forever)'),
        z.describe('lock_timeout of each migration on each shard.'),
      ),
      '5s',
    ),
    // How long a host may leave a statement unanswered before a fresh connection checks it is alive.
    hostTimeout: z._default(
      duration(
        z.refine(
          (value) => !DURATION.test(value) || durationMs(value) >= MIN_HOST_TIMEOUT_MS,
          'must be at least 100ms',
        ),
        z.describe('A host silent this long while a statement waits is checked over a new connection; at least 100ms.'),
      ),
      '10s',
    ),
    hosts: z
      .array(hostSchema, { error: 'must be a list of hosts' })
      .check(
        z.minLength(1, 'must list at least one host'),
        z.describe('The physical hosts; every shard is on exactly one of them.'),
      ),
    // Editors read it from JSON configs; shardctl ignores it.
    $schema: z.optional(
      z.string({ error: 'must be a string' }).check(z.describe('The JSON Schema of this file, for editors.')),
    ),
  })
  .check(
    z.meta({
      title: 'shardctl config',
      description: 'The shard map and settings of a shardctl fleet (shardctl.yaml).',
    }),
  );

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
