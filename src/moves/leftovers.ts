import type pg from 'pg';
import { sleep } from '../clock.js';
import { CONTROL, controlTableExists } from '../fleet/control.js';
import { leftoverReplicationSql } from './sql/leftovers.js';
import {
  detachSubscriptionSql,
  dropPublicationSql,
  dropSubscriptionSql,
  forgetObjectSql,
  PROBE_SUBSCRIPTIONS_SQL,
  SLOT_ACTIVE_PID_SQL,
  DROP_SLOT_SQL,
} from './sql/replication.js';
import { TERMINATE_BACKEND_SQL } from './sql/session.js';

/**
 * What moves create outside the shard schemas and must remove again: the reachability probe's
 * subscription (recorded before it is created), and each move's publication, subscription and
 * slot (named after the move). Any of these that no running move on the host accounts for is a
 * leftover of a killed run: status lists them, gc and move-shard --abort drop them.
 */
export interface Leftover {
  /** `change-log`: rows of a finished or undone move's change log (named by the move id), gc only. */
  readonly kind: 'probe-subscription' | 'publication' | 'subscription' | 'slot' | 'change-log';
  readonly name: string;
}

export async function findLeftovers(
  client: pg.Client,
  { changeLogs = false }: { readonly changeLogs?: boolean } = {},
): Promise<Leftover[]> {
  const probes = (await controlTableExists(client, 'objects'))
    ? (await client.query<{ name: string }>(PROBE_SUBSCRIPTIONS_SQL)).rows
    : [];
  const moves = await controlTableExists(client, 'moves');
  const replication = await client.query<{ kind: Leftover['kind']; name: string }>(leftoverReplicationSql(moves));
  // Entries a finished or undone move's log took after it was turned off (writers in flight at its
  // removal), or a start marker whose table an abort dropped: one pass over the log, so for gc only.
  const logs =
    changeLogs && moves && (await controlTableExists(client, 'move_deltas'))
      ? (await client.query<{ name: string }>(FINISHED_LOGS_SQL)).rows
      : [];
  return [
    ...probes.map((p) => ({ kind: 'probe-subscription' as const, name: p.name })),
    ...replication.rows,
    ...logs.map((l) => ({ kind: 'change-log' as const, name: l.name })),
  ];
}

/** The moves with change-log entries that are not running (the moves that log are recorded first). */
const FINISHED_LOGS_SQL = `SELECT d.move_id AS name FROM ${CONTROL}.move_deltas d
  WHERE NOT EXISTS (SELECT FROM ${CONTROL}.moves m WHERE m.move_id = d.move_id AND m.status = 'running')
  GROUP BY d.move_id ORDER BY d.move_id`;

/** Drops leftovers found by findLeftovers; returns what was dropped. */
export async function dropLeftovers(client: pg.Client, leftovers: readonly Leftover[]): Promise<Leftover[]> {
  for (const leftover of leftovers) {
    switch (leftover.kind) {
      case 'probe-subscription':
        // Created disabled and without a slot: dropping it needs no connection to the source.
        await client.query(dropSubscriptionSql(leftover.name, { ifExists: true }));
        await client.query(forgetObjectSql(leftover.name));
        break;
      case 'subscription':
        await dropSubscription(client, leftover.name);
        break;
      case 'publication':
        await client.query(dropPublicationSql(leftover.name));
        break;
      case 'slot':
        await dropSlot(client, leftover.name);
        break;
      case 'change-log':
        await client.query(
          `DELETE FROM ${CONTROL}.move_deltas d WHERE d.move_id = $1
             AND NOT EXISTS (SELECT FROM ${CONTROL}.moves m WHERE m.move_id = d.move_id AND m.status = 'running')`,
          [leftover.name],
        );
        break;
    }
  }
  return [...leftovers];
}

/**
 * Drops a subscription if it exists. When its source cannot be reached (DROP SUBSCRIPTION connects
 * to drop the slot), it is detached from its slot first; the slot is then a leftover on the source.
 */
export async function dropSubscription(client: pg.Client, name: string): Promise<void> {
  try {
    await client.query(dropSubscriptionSql(name, { ifExists: true }));
  } catch {
    // Handled: DROP SUBSCRIPTION could not reach the source to drop its slot.
    await client.query(detachSubscriptionSql(name));
    await client.query(dropSubscriptionSql(name, { ifExists: true }));
  }
}

/**
 * Drops a replication slot if it exists; a slot still held by a walsender is freed by ending it,
 * which takes a moment. False when the slot is still there after 5 s.
 */
export async function dropSlot(client: pg.Client, name: string): Promise<boolean> {
  for (let attempt = 0; attempt < 50; attempt++) {
    const slot = await client.query<{ active_pid: number | null }>(SLOT_ACTIVE_PID_SQL, [name]);
    if (!slot.rowCount) return true;
    const pid = slot.rows[0]!.active_pid;
    if (pid !== null) await client.query(TERMINATE_BACKEND_SQL, [pid]);
    // A walsender may take the slot again or it may be gone already: the loop looks again, and says false
    // after 5 s.
    else await client.query(DROP_SLOT_SQL, [name]).catch(() => undefined);
    await sleep(100);
  }
  return false;
}
