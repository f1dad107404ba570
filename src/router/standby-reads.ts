import type pg from 'pg';
import type { HostConfig } from '../config/types.js';
import { HostError } from '../errors.js';
import { describePgError } from '../fleet/connect.js';
import type { TransactionStart } from './begin.js';
import type { CallTrace, RouterDiagnostics } from './diagnostics.js';
import { isConnectionLoss } from './failover.js';
import {
  isRecoveryConflict,
  replicaRefusal,
  type ReplicaFallback,
  type ReplicaRead,
  type Standby,
  type StandbyBook,
} from './replicas.js';
import type { Attempt, Via } from './types.js';

/**
 * The router's replica reads (`replica: true`): a call, or a chunk of one host's shards, run first
 * on a standby of the host (replicas.ts says which addresses are standbys and what the check a
 * replica transaction starts with refuses), and on the primary when none will do.
 */
export class StandbyReads {
  constructor(
    private readonly standbys: StandbyBook,
    private readonly diagnostics: RouterDiagnostics,
    /** The start of a shard's read on a standby, with its check, on the router's map now (transaction.ts). */
    private readonly replicaStart: (
      shard: number,
      read: { readonly maxLagMs: number; readonly afterLsn?: string },
    ) => TransactionStart,
  ) {}

  /**
   * A replica read on `host`'s standby (replicas.ts): `attempt` runs there first; the primary
   * (`attempt` without a Via) takes the call when the host has no standby that answers, when the
   * standby refuses (not a standby, no WAL receiver, too far behind, the shard not active there;
   * behind a write asked for only after `waitMs`), or when the read met a connection loss or a
   * recovery conflict there (read-only, so running it again is safe). fn's own errors on the standby
   * (a moved shard's SC100 among them) go to the caller's loop as on the primary.
   */
  async onReplica<T>(
    host: HostConfig,
    shard: number,
    replica: ReplicaRead,
    trace: CallTrace | undefined,
    attempt: (via?: Via) => Promise<Attempt<T>>,
  ): Promise<Attempt<T>> {
    const onPrimary = (reason: ReplicaFallback): Promise<Attempt<T>> => {
      this.diagnostics.replicaFallback(host.name, reason);
      trace?.replica(reason);
      return attempt();
    };
    // An LSN of another host (the shard moved since the write) says nothing about this one's standbys.
    if (replica.afterLsn && replica.afterLsn.host !== host.name) return onPrimary('moved');
    const standby = await this.standbys.pick(host).catch(() => undefined);
    if (!standby) return onPrimary('no-standby');
    const via = this.standbyVia(host, standby, replica);
    const deadline = Date.now() + replica.waitMs;
    for (;;) {
      let result: Attempt<T>;
      try {
        result = await attempt(via);
      } catch {
        this.standbys.failed(host.name, standby);
        return onPrimary('unreachable');
      }
      if (result.ok) {
        this.diagnostics.replicaRead(host.name);
        trace?.replica('standby');
        return result;
      }
      const refusal = replicaRefusal(result.error);
      if (refusal === undefined) {
        if (isConnectionLoss(result.error)) {
          this.standbys.failed(host.name, standby);
          return onPrimary('unreachable');
        }
        if (isRecoveryConflict(result.error)) return onPrimary('conflict');
        return result;
      }
      if (refusal === 'not-standby' || refusal === 'no-receiver') this.standbys.failed(host.name, standby);
      if (refusal === 'behind' && replica.afterLsn && Date.now() < deadline) {
        const replayed = await this.standbys.replayed(standby, replica.afterLsn.lsn, deadline).catch(() => false);
        if (replayed) continue;
      }
      return onPrimary(refusal);
    }
  }

  /**
   * A chunk of one host's shards as a replica read (queryEachShard, queryPage): on a standby of the
   * host, or on the primary as one round trip still (`attempt` without a Via) when the host has no
   * standby that answers or the read must go there (an LSN of another host), each shard counted as
   * a fallback for that reason. Undefined when the chunk did not run whole on the standby: the
   * shards then run one by one, each a replica read of its own (onReplica), which names why one
   * went to the primary. The round trip's event (`trace`) says where it ran and its pool wait.
   */
  async chunkOnReplica<V>(
    host: HostConfig,
    shards: readonly number[],
    replica: ReplicaRead,
    trace: CallTrace | undefined,
    attempt: (via?: Via) => Promise<V[] | undefined>,
  ): Promise<V[] | undefined> {
    const onPrimary = async (reason: ReplicaFallback): Promise<V[] | undefined> => {
      const values = await attempt();
      if (values) {
        this.diagnostics.replicaFallback(host.name, reason, shards.length);
        trace?.replica(reason);
      }
      return values;
    };
    if (replica.afterLsn && replica.afterLsn.host !== host.name) return onPrimary('moved');
    const standby = await this.standbys.pick(host).catch(() => undefined);
    if (!standby) return onPrimary('no-standby');
    const values = await attempt(this.standbyVia(host, standby, replica)).catch(() => undefined);
    if (values) {
      this.diagnostics.replicaRead(host.name, shards.length);
      trace?.replica('standby');
    }
    return values;
  }

  private standbyVia(host: HostConfig, standby: Standby, replica: ReplicaRead): Via {
    const read = {
      maxLagMs: replica.maxLagMs,
      ...(replica.afterLsn ? { afterLsn: replica.afterLsn.lsn } : {}),
    };
    return {
      checkout: () => this.checkoutFrom(host, standby.pool),
      start: (shard) => this.replicaStart(shard, read),
    };
  }

  /** A connection of a standby's pool; failing names the host. */
  private async checkoutFrom(host: HostConfig, pool: pg.Pool): Promise<pg.PoolClient> {
    try {
      return await pool.connect();
    } catch (error) {
      throw new HostError(host.name, `cannot connect to a standby: ${describePgError(error)}`, {
        code: 'HOST_UNREACHABLE',
        cause: error,
      });
    }
  }
}
