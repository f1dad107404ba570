import pg from 'pg';
import { statementMessages, type TransactionStart } from './begin.js';

/**
 * One parameterised statement on several shards of one host, in one round trip: for each shard,
 * Parse/Bind/Execute of its `BEGIN READ ONLY` and `SET LOCAL search_path`, the statement's own
 * Parse/Bind/Describe/Execute with the same values, and `COMMIT`; one Sync after the last.
 *
 * A simple-query text can hold several shards' transactions (queryEachShard's `shardsPerQuery`) but
 * no bind parameters; the extended protocol takes parameters but one statement per Parse. So each
 * shard gets its own Parse, after its own `SET LOCAL search_path`: the server resolves the
 * statement's table names in that shard's schema. Every shard's transaction is its own (nothing
 * one sets reaches the next), as in the text chunks.
 *
 * An error anywhere makes the server skip everything up to the Sync, leaving the failing shard's
 * transaction open and aborted: the query fails, the caller rolls back and runs the shards one by
 * one (so a shard being moved is followed, and a failing one named).
 *
 * Like FirstQuery (begin.ts) this extends pg's Query and overrides `prepare` and `_getRows`, which
 * are not pg's public API; checkPgInternals() guards them, and without them the caller never
 * builds a ShardsQuery.
 */
export class ShardsQuery extends (pg.Query as unknown as new (
  config: pg.QueryConfig & { queryMode?: 'extended' },
) => QueryInternals) {
  private bindFailed = false;

  constructor(
    text: string,
    values: readonly unknown[],
    private readonly starts: readonly TransactionStart[],
    types: pg.QueryConfig['types'] | undefined,
  ) {
    super({ text, values: [...values], ...(types ? { types } : {}), queryMode: 'extended' });
    // The results were given the type parsers above; pg's Parse must not read them as parameter types.
    this.types = undefined;
  }

  override prepare(connection: WireConnection): void {
    for (const start of this.starts) {
      send(connection, start.messages);
      // Parse, Bind, Describe, and Execute through _getRows below (which leaves out pg's Sync).
      super.prepare(connection);
      // A value that cannot be bound: pg already wrote Close and Sync and failed the query.
      if (this.bindFailed) return;
      send(connection, COMMIT);
    }
    connection.sync();
  }

  override _getRows(connection: WireConnection): void {
    connection.execute({ portal: this.portal });
  }

  override handleError(error: Error, connection: WireConnection): void {
    this.bindFailed = true;
    super.handleError(error, connection);
  }
}

const COMMIT = statementMessages('COMMIT');

interface WireConnection {
  stream: { writable: boolean; write(data: Buffer): boolean };
  execute(config: { portal?: string; rows?: number }): void;
  sync(): void;
}

interface QueryInternals {
  portal: string;
  types: unknown;
  callback?: (error: Error | null, result: unknown) => void;
  prepare(connection: WireConnection): void;
  _getRows(connection: WireConnection, rows?: number): void;
  handleError(error: Error, connection: WireConnection): void;
}

function send(connection: WireConnection, bytes: Buffer): void {
  if (connection.stream.writable) connection.stream.write(bytes);
}

/** Runs a ShardsQuery on a client; resolves with every result (the framing statements' too) in order. */
export function runShardsQuery(client: pg.PoolClient, query: ShardsQuery): Promise<pg.QueryResult[]> {
  return new Promise((resolve, reject) => {
    query.callback = (error, result) => {
      if (error) reject(error);
      else resolve(Array.isArray(result) ? (result as pg.QueryResult[]) : [result as pg.QueryResult]);
    };
    void client.query(query as unknown as pg.Submittable);
  });
}
