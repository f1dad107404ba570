/** One check of a move's preflight (preflight.ts), as the dry run and a refused move report it. */
export interface PreflightCheck {
  readonly name: string;
  readonly ok: boolean;
  /**
   * What was found, and when not ok, what to change. This stays words for a person, command names
   * included, rather than a `next` list (errors.ts): most advice here is no shardctl command at all
   * (ALTER TABLE … SET LOGGED, wal_level, dropping a schema), the dry run prints these lines as a
   * report, and a program acts on `name` and `ok`.
   */
  readonly message: string;
}
