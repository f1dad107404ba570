/**
 * SQLSTATEs shardctl acts on by name (the lock waits' are in quiet.ts), and the test of an error
 * for one of them on itself or on the errors it wraps (a HostError's cause).
 */

/** insufficient_privilege: the role may not do what was asked. */
export const INSUFFICIENT_PRIVILEGE = '42501';

/** Whether `error`, or an error it wraps (up to three deep), carries SQLSTATE `code`. */
export function hasSqlState(error: unknown, code: string): boolean {
  for (let e: unknown = error, depth = 0; e instanceof Error && depth < 4; e = e.cause, depth++)
    if ((e as { code?: unknown }).code === code) return true;
  return false;
}
