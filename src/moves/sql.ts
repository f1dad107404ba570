import { CONTROL } from '../fleet/control.js';
import { quoteIdent, quoteLiteral } from '../pg/quote.js';

/**
 * The SQL a move sends, one pure function per statement or transaction, so each can be read and
 * unit-tested as text. The step logic in move.ts decides when; these decide what.
 */

export function qualified(schema: string, table: string): string {
  return `${quoteIdent(schema)}.${quoteIdent(table)}`;
}

/** The shard's tables (every schema of the shard) and this move's marker rows, replicated to the target. */
export function createPublicationSql(name: string, schemas: readonly string[], moveId: string): string {
  return (
    `CREATE PUBLICATION ${quoteIdent(name)} FOR TABLES IN SCHEMA ${schemas.map(quoteIdent).join(', ')},\n` +
    `  TABLE ${CONTROL}.move_markers WHERE (move_id = ${quoteLiteral(moveId)})`
  );
}

/**
 * Streams from the slot the copy step created, without copying again (the rows came from the slot's
 * snapshot). Binary only between equal major versions.
 */
export function createSubscriptionSql(name: string, sourceReplicationUrl: string, binary: boolean): string {
  return (
    `CREATE SUBSCRIPTION ${quoteIdent(name)} CONNECTION ${quoteLiteral(sourceReplicationUrl)}\n` +
    `  PUBLICATION ${quoteIdent(name)}\n` +
    `  WITH (slot_name = ${quoteLiteral(name)}, create_slot = false, copy_data = false, binary = ${binary})`
  );
}

/** The replication connection's command: a logical slot whose snapshot the copy reads. */
export function createSlotCommand(name: string): string {
  return `CREATE_REPLICATION_SLOT ${quoteIdent(name)} LOGICAL pgoutput EXPORT_SNAPSHOT`;
}

export function dropSubscriptionSql(name: string, options: { ifExists?: boolean } = {}): string {
  return `DROP SUBSCRIPTION ${options.ifExists ? 'IF EXISTS ' : ''}${quoteIdent(name)}`;
}

/**
 * A disabled subscription with no slot: creating it makes the target open a replication connection
 * to the source, which is the point (preflight's "target reaches source").
 */
export function probeSubscriptionSql(name: string, sourceReplicationUrl: string): string {
  return (
    `CREATE SUBSCRIPTION ${quoteIdent(name)} CONNECTION ${quoteLiteral(sourceReplicationUrl)} PUBLICATION shardctl_probe
` +
    `  WITH (connect = true, enabled = false, create_slot = false, slot_name = NONE)`
  );
}

/** Detaches a subscription from its slot, for when the source cannot be reached to drop the slot. */
export function detachSubscriptionSql(name: string): string {
  return `ALTER SUBSCRIPTION ${quoteIdent(name)} DISABLE;\nALTER SUBSCRIPTION ${quoteIdent(name)} SET (slot_name = NONE)`;
}

export function dropPublicationSql(name: string): string {
  return `DROP PUBLICATION IF EXISTS ${quoteIdent(name)}`;
}

export function insertMarkerSql(moveId: string, kind: string): string {
  return `INSERT INTO ${CONTROL}.move_markers (move_id, kind) VALUES (${quoteLiteral(moveId)}, ${quoteLiteral(kind)}) ON CONFLICT DO NOTHING;`;
}

export interface FenceInput {
  readonly shard: number;
  /** Every table of the shard including partitions, as [schema, table]. */
  readonly tables: readonly (readonly [string, string])[];
  readonly moveId: string;
  /** The marker kind of this fence attempt. */
  readonly marker: string;
  /** Where the shard is going, named in the SC100 error. */
  readonly targetHost: string;
  /** CREATE OR REPLACE TRIGGER exists from PostgreSQL 14. */
  readonly createOrReplaceTrigger: boolean;
}

/**
 * The fence, in one transaction: wait for in-flight writers (SHARE ROW EXCLUSIVE conflicts with
 * their locks), then a statement trigger on every table that refuses every write with SQLSTATE
 * SC100, the shard marked fenced, and the fence marker the target waits for.
 */
export function fenceSql(input: FenceInput): string {
  const tables = input.tables.map(([schema, table]) => qualified(schema, table));
  const fn = `${CONTROL}.shard_fenced(${quoteLiteral(String(input.shard))}, ${quoteLiteral(input.targetHost)})`;
  const triggers = tables.map((t) =>
    input.createOrReplaceTrigger
      ? `CREATE OR REPLACE TRIGGER shardctl_fence BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON ${t} FOR EACH STATEMENT EXECUTE FUNCTION ${fn};`
      : // Before PostgreSQL 14: drop and create (a stronger lock, held for the few ms of this transaction).
        `DROP TRIGGER IF EXISTS shardctl_fence ON ${t};\nCREATE TRIGGER shardctl_fence BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON ${t} FOR EACH STATEMENT EXECUTE FUNCTION ${fn};`,
  );
  return [
    'BEGIN;',
    `SET LOCAL lock_timeout = '2s';`,
    ...(tables.length > 0 ? [`LOCK TABLE ${tables.join(', ')} IN SHARE ROW EXCLUSIVE MODE;`] : []),
    ...triggers,
    `UPDATE ${CONTROL}.shards SET state = 'fenced' WHERE shard = ${input.shard};`,
    insertMarkerSql(input.moveId, input.marker),
    `UPDATE ${CONTROL}.moves SET detail = detail || ${quoteLiteral(JSON.stringify({ fenceMarker: input.marker }))}::jsonb WHERE move_id = ${quoteLiteral(input.moveId)};`,
    'COMMIT;',
  ].join('\n');
}

/** Undoes the fence: triggers dropped, the shard active again, this move's fence markers gone. */
export function unfenceSql(shard: number, tables: readonly (readonly [string, string])[], moveId: string): string {
  return [
    'BEGIN;',
    ...tables.map(([schema, table]) => `DROP TRIGGER IF EXISTS shardctl_fence ON ${qualified(schema, table)};`),
    `UPDATE ${CONTROL}.shards SET state = 'active' WHERE shard = ${shard} AND state = 'fenced';`,
    `DELETE FROM ${CONTROL}.move_markers WHERE move_id = ${quoteLiteral(moveId)} AND kind LIKE 'fenced%';`,
    'COMMIT;',
  ].join('\n');
}

export interface Grant {
  /** The table, for a table grant. */
  readonly relname?: string;
  /** Null: PUBLIC. */
  readonly grantee: string | null;
  readonly privilege: string;
}

export interface RenameWithStubInput {
  readonly shard: number;
  readonly schema: string;
  readonly renamed: string;
  readonly targetHost: string;
  /** Every table of the shard including partitions. */
  readonly tables: readonly string[];
  readonly schemaGrants: readonly Grant[];
  readonly tableGrants: readonly Grant[];
}

/**
 * The old copy renamed, and under the old name a view per table over the renamed copy, with the
 * old schema's and tables' grants: a client still on the old map gets SC100 for reads (the
 * shard_moved guard) and writes (writes through a simple view hit the base table's fence), not
 * "does not exist" or "permission denied", and reloads its map.
 */
export function renameWithStubSql(input: RenameWithStubInput): string {
  const { shard, schema, renamed, targetHost } = input;
  const to = (grantee: string | null): string => (grantee === null ? 'PUBLIC' : quoteIdent(grantee));
  const guard = `${CONTROL}.shard_moved(${quoteLiteral(String(shard))}, ${quoteLiteral(targetHost)})`;
  return [
    'BEGIN;',
    `ALTER SCHEMA ${quoteIdent(schema)} RENAME TO ${quoteIdent(renamed)};`,
    `CREATE SCHEMA ${quoteIdent(schema)};`,
    `COMMENT ON SCHEMA ${quoteIdent(schema)} IS ${quoteLiteral(`shardctl: shard ${shard} moved to ${targetHost}; views over the fenced old copy ${renamed} until shardctl gc`)};`,
    ...input.tables.map((t) => `CREATE VIEW ${qualified(schema, t)} AS SELECT * FROM ${qualified(renamed, t)} WHERE ${guard};`),
    ...input.schemaGrants.filter((g) => g.privilege === 'USAGE').map((g) => `GRANT USAGE ON SCHEMA ${quoteIdent(schema)} TO ${to(g.grantee)};`),
    ...input.tableGrants
      .filter((g) => g.relname !== undefined && ['SELECT', 'INSERT', 'UPDATE', 'DELETE'].includes(g.privilege))
      .map((g) => `GRANT ${g.privilege} ON ${qualified(schema, g.relname!)} TO ${to(g.grantee)};`),
    `UPDATE ${CONTROL}.shards SET schema_name = ${quoteLiteral(renamed)} WHERE shard = ${shard};`,
    'COMMIT;',
  ].join('\n');
}

/** The name the old copy gets after a move (PostgreSQL truncates identifiers at 63 bytes). */
export function oldCopyName(schema: string, moveId: string): string {
  return `${schema}_moved_${moveId}`.slice(0, 63);
}

/** Names of the replication objects of a move: publication, subscription and slot share it. */
export function replicationName(moveId: string): string {
  return `shardctl_move_${moveId}`;
}
