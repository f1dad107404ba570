import type { ShardctlConfig } from '../config/types.js';
import { hostForShard, shardSchemaName } from '../config/types.js';
import { HostError } from '../errors.js';
import { describePgError } from '../fleet/connect.js';
import { CONTROL, controlTableExists } from '../fleet/control.js';
import { withSession } from '../fleet/session.js';
import { dropShardSql } from '../fleet/sql.js';

export interface OldCopy {
  readonly host: string;
  readonly shard: number;
  readonly schema: string;
}

/**
 * `shardctl gc`: the fenced old copies that finished moves left behind (state fenced in the control
 * schema, shard mapped elsewhere). With dryRun they are only listed; otherwise dropped.
 */
export async function gc(config: ShardctlConfig, options: { dryRun?: boolean } = {}): Promise<OldCopy[]> {
  const found: OldCopy[] = [];
  for (const host of config.hosts) {
    try {
      await withSession(
        host,
        async ({ client }) => {
          if (!(await controlTableExists(client, 'shards'))) return;
          const rows = await client.query<{ shard: number; schema_name: string }>(
            `SELECT s.shard, s.schema_name FROM ${CONTROL}.shards s
              WHERE s.state = 'fenced'
                AND NOT EXISTS (SELECT 1 FROM ${CONTROL}.moves m WHERE m.shard = s.shard AND m.status = 'running')
              ORDER BY s.shard`,
          );
          for (const row of rows.rows) {
            // Never drop the copy the map points at, whatever the control row says.
            if (hostForShard(config, row.shard)?.name === host.name) continue;
            found.push({ host: host.name, shard: row.shard, schema: row.schema_name });
            if (options.dryRun) continue;
            // The old copy, and the views left under the shard's own name (see move-shard cleanup).
            const stub = shardSchemaName(config, row.shard);
            await client.query(dropShardSql(row.shard, [row.schema_name, stub]));
          }
        },
        { applicationName: 'shardctl gc' },
      );
    } catch (error) {
      if (error instanceof HostError) throw error;
      throw new HostError(host.name, `gc failed: ${describePgError(error)}`, { cause: error });
    }
  }
  return found;
}
