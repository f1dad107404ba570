import { existsSync, statSync } from 'node:fs';
import path from 'node:path';
import type { Env } from '../config/env.js';
import { hostForShard, shardSchemaName, type ShardctlConfig } from '../config/types.js';
import { formatPostgresUrl, parsePostgresUrl } from '../pg/multihost.js';
import { UsageError } from '../errors.js';
import { quoteIdent } from '../pg/quote.js';
import { redact, registerUrlSecret } from '../pg/redact.js';

/** What `shardctl psql` runs: the program, its arguments and its environment. */
export interface PsqlInvocation {
  readonly shard: number;
  readonly host: string;
  readonly schema: string;
  /** The host's connection string without its password: the only connection argument psql gets. */
  readonly args: readonly string[];
  /** The caller's environment plus PGOPTIONS (search_path) and, when the URL has one, PGPASSWORD. */
  readonly env: Record<string, string>;
  /** For people: the connection string with the password shown as ***, and the search_path option. */
  readonly display: { url: string; pgOptions: string };
  /**
   * When the URL carries a secret libpq has no environment variable for (sslpassword): the text of
   * a connection service file holding it (service PSQL_SERVICE, which env's PGSERVICE names). The
   * caller writes it readable by its owner only, points PGSERVICEFILE at it while psql runs, and
   * removes it after.
   */
  readonly serviceFile?: string;
}

/** The service of the file in PsqlInvocation.serviceFile. */
export const PSQL_SERVICE = 'shardctl_psql';

/**
 * The psql command for a shard. The password leaves the URL and goes into PGPASSWORD, so it is on
 * no command line (`ps` shows arguments to every user of the machine); search_path reaches the
 * server as a startup option through PGOPTIONS, so it holds before the first prompt.
 */
export function psqlInvocation(config: ShardctlConfig, shard: number, env: Env = process.env): PsqlInvocation {
  const host = hostForShard(config, shard);
  if (!host) throw new RangeError(`shard ${shard} is not in the map (0-${config.shards - 1})`);
  registerUrlSecret(host.url);
  const schema = shardSchemaName(config, shard);
  // psql (libpq) reads a URL of several addresses itself; only the password is taken out of it.
  const parsed = parsePostgresUrl(host.url, `host ${host.name} url`);
  const userinfo = parsed.userinfo ?? '';
  const colon = userinfo.indexOf(':');
  let password = colon >= 0 ? decodeURIComponent(userinfo.slice(colon + 1)) || undefined : undefined;
  const params = new URLSearchParams(parsed.query.slice(1));
  // libpq also reads a password from the query string (?password=…): move it too.
  const queryPassword = params.get('password');
  if (queryPassword !== null) {
    password ??= queryPassword;
    params.delete('password');
  }
  // libpq reads sslpassword from no environment variable: it goes into a service file instead.
  const sslPassword = params.get('sslpassword');
  params.delete('sslpassword');
  if (sslPassword !== null && (/[\r\n\0]/.test(sslPassword) || /\s$/.test(sslPassword))) {
    throw new UsageError(
      `host ${host.name} url: its sslpassword cannot be handed to psql without putting it on the command line (it ends in a space or holds a line break)`,
    );
  }
  const query = params.toString();
  const url = formatPostgresUrl({
    ...parsed,
    userinfo: colon >= 0 ? userinfo.slice(0, colon) : parsed.userinfo,
    query: query ? `?${query}` : '',
  });
  const schemaOption = `-c search_path=${quoteIdent(schema)}`;
  const pgOptions = env['PGOPTIONS'] ? `${env['PGOPTIONS']} ${schemaOption}` : schemaOption;
  const childEnv: Record<string, string> = {};
  for (const [k, v] of Object.entries(env)) if (v !== undefined) childEnv[k] = v;
  childEnv['PGOPTIONS'] = pgOptions;
  if (password !== undefined) childEnv['PGPASSWORD'] = password;
  if (sslPassword !== null) childEnv['PGSERVICE'] = PSQL_SERVICE;
  return {
    shard,
    host: host.name,
    schema,
    args: [url],
    env: childEnv,
    display: { url: redact(host.url), pgOptions },
    ...(sslPassword === null ? {} : { serviceFile: `[${PSQL_SERVICE}]\nsslpassword=${sslPassword}\n` }),
  };
}

/** The psql to run: $SHARDCTL_PSQL if set, else the first `psql` on PATH; null when there is none. */
export function findPsql(env: Env = process.env): string | null {
  const chosen = env['SHARDCTL_PSQL'];
  if (chosen) return chosen;
  for (const dir of (env['PATH'] ?? '').split(path.delimiter)) {
    if (!dir) continue;
    const candidate = path.join(dir, 'psql');
    if (existsSync(candidate) && statSync(candidate).isFile()) return candidate;
  }
  return null;
}
