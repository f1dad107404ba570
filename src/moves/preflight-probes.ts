import { randomBytes } from 'node:crypto';
import { constants } from 'node:fs';
import { access } from 'node:fs/promises';
import { dirname } from 'node:path';
import pg from 'pg';
import type { HostConfig } from '../config/types.js';
import { connectedUrl, describePgError } from '../fleet/connect.js';
import { hostClientSettings } from '../fleet/silence.js';
import { endQuietly } from '../pg/quiet.js';
import { INSUFFICIENT_PRIVILEGE } from '../pg/sqlstate.js';
import { libpqCompatible } from '../pg/tls.js';
import type { PreflightCheck } from './preflight-check.js';
import { dropSubscriptionSql, forgetObjectSql, probeSubscriptionSql, recordObjectSql } from './sql/replication.js';
import { CURRENT_USER_SQL } from './sql/session.js';
import { faultAfter } from './state.js';

/**
 * What the preflight tries rather than reads: that the config file can be rewritten, that shardctl
 * can open a replication connection to the source, and that the target can subscribe to it.
 */

/**
 * Last, and only when every other check passed (`probe`: an online move not in a dry run):
 * shardctl's own replication connection to the source (the copy's snapshot needs one: a pooler
 * refuses it), then a subscription created and dropped on the target; each appended to `checks`,
 * the second only when the first passed.
 */
export async function reachabilityChecks(
  probe: boolean,
  checks: PreflightCheck[],
  source: HostConfig,
  target: HostConfig,
  src: pg.Client,
  dst: pg.Client,
): Promise<void> {
  const add = (name: string, ok: boolean, message: string): void => {
    checks.push({ name, ok, message });
  };
  if (probe && checks.every((c) => c.ok)) {
    const own = await probeReplicationConnection(source, src);
    add(
      'replication connection',
      own === null,
      own === null
        ? `shardctl can open a replication connection to ${source.name}`
        : `shardctl cannot open a replication connection to ${source.name}: ${own.text}` +
            (/unsupported startup parameter/i.test(own.text)
              ? `; that address looks like a connection pooler's: set ${source.name}'s directUrl to the server's own address`
              : own.code === INSUFFICIENT_PRIVILEGE
                ? `; give ${await currentUser(src)} the REPLICATION attribute on ${source.name} (ALTER ROLE … REPLICATION; on a managed service, its replication role), or use --mode offline`
                : ''),
    );
  }
  if (probe && checks.every((c) => c.ok)) {
    const reach = await probeSubscription(dst, source.replicationUrl);
    add(
      'target reaches source',
      reach === null,
      reach === null
        ? `${target.name} can connect to ${source.name} for replication`
        : `${target.name} cannot ${reach.code === INSUFFICIENT_PRIVILEGE ? 'subscribe' : 'connect'} to ${source.name} at its replicationUrl: ${reach.text}; ` +
            (/unsupported startup parameter/i.test(reach.text)
              ? `that address looks like a connection pooler's: set ${source.name}'s directUrl (or replicationUrl) to the server's own address`
              : reach.code === INSUFFICIENT_PRIVILEGE
                ? `let ${await currentUser(dst)} create subscriptions on ${target.name} (PostgreSQL 16 and later: GRANT pg_create_subscription TO it; 15: only a superuser, or a managed service's own replication role, may), or use --mode offline`
                : reach.code === PASSWORD_REQUIRED
                  ? `a subscription whose owner is not a superuser must log in with a password: put it in ${source.name}'s replicationUrl (or url) and have ${source.name} ask for it (pg_hba.conf: scram-sha-256 for ${target.name}'s address)`
                  : `set hosts[].replicationUrl to an address ${target.name} can reach`),
    );
  } else if (probe) {
    add('target reaches source', true, 'not probed: other checks failed');
  }
}

/** A non-superuser's subscription to a server that asks for no password, or a connection string without one (16+). */
const PASSWORD_REQUIRED = '2F003';

/** What a probe met: the error, redacted, and its SQLSTATE. */
interface ProbeFailure {
  readonly text: string;
  readonly code: string | undefined;
}

function probeFailure(error: unknown): ProbeFailure {
  const code = (error as { code?: unknown }).code;
  return { text: describePgError(error), code: typeof code === 'string' ? code : undefined };
}

async function currentUser(client: pg.Client): Promise<string> {
  return (await client.query<{ current: string }>(CURRENT_USER_SQL)).rows[0]!.current;
}

/** Null when the file and its folder (for the atomic rename) are writable; else why not. */
export async function canRewrite(file: string): Promise<string | null> {
  if (file === '<inline>') return 'the config was not read from a file (pass configFile)';
  try {
    await access(file, constants.R_OK | constants.W_OK);
    await access(dirname(file), constants.W_OK);
    return null;
  } catch (error) {
    return (error as Error).message;
  }
}

/**
 * Null when shardctl can open a replication connection (the kind the copy's snapshot is taken on)
 * to the address the source's session reached; else the error, redacted.
 */
async function probeReplicationConnection(host: HostConfig, session: pg.Client): Promise<ProbeFailure | null> {
  // node-postgres supports replication connections; its type definitions do not list the option.
  const config: pg.ClientConfig & { replication: string } = {
    connectionString: libpqCompatible(connectedUrl(host, session)),
    replication: 'database',
    application_name: 'shardctl move',
    ...hostClientSettings(host),
  };
  const client = new pg.Client(config);
  client.on('error', () => undefined);
  try {
    await client.connect();
    return null;
  } catch (error) {
    return probeFailure(error);
  } finally {
    await endQuietly(client);
  }
}

/**
 * Null when the target could open a replication connection to the source; else the error. The probe
 * subscription is recorded in the control schema before it is created, so a run killed in between
 * leaves a leftover that status lists and gc or --abort removes (src/moves/leftovers.ts).
 */
async function probeSubscription(target: pg.Client, sourceUrl: string): Promise<ProbeFailure | null> {
  // Unique per call: the moves of a batch probe the same target at the same moment.
  const name = `shardctl_probe_${process.pid}_${randomBytes(4).toString('hex')}`;
  await target.query(recordObjectSql(name, 'probe-subscription'));
  try {
    await target.query(probeSubscriptionSql(name, sourceUrl));
    faultAfter('probe');
    await target.query(dropSubscriptionSql(name));
    return null;
  } catch (error) {
    // A failed CREATE SUBSCRIPTION leaves nothing to drop; on a broken connection the record below stays, a
    // leftover that gc and an abort remove.
    await target.query(dropSubscriptionSql(name, { ifExists: true })).catch(() => undefined);
    return probeFailure(error);
  } finally {
    // Fails only on a broken connection: the record then stays, a leftover that gc and an abort remove.
    await target.query(forgetObjectSql(name)).catch(() => undefined);
  }
}
