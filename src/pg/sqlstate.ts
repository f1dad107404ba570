/**
 * SQLSTATEs shardctl acts on by name (the lock waits' are in quiet.ts), and the tests of an error
 * for one of them, or for any, on itself or on the errors it wraps (a HostError's cause).
 */

/** insufficient_privilege: the role may not do what was asked. */
export const INSUFFICIENT_PRIVILEGE = '42501';

/** Whether `code` has the shape of a SQLSTATE (five digits or capitals): the server's answer, not a socket's errno. */
export function isSqlState(code: unknown): code is string {
  return typeof code === 'string' && /^[0-9A-Z]{5}$/.test(code);
}

/** `error` and the errors it wraps (up to three deep), outermost first. */
function* wrapped(error: unknown): Generator<unknown> {
  for (let e: unknown = error, depth = 0; e instanceof Error && depth < 4; e = e.cause, depth++) yield e;
}

/** Whether `error`, or an error it wraps (up to three deep), carries SQLSTATE `code`. */
export function hasSqlState(error: unknown, code: string): boolean {
  for (const e of wrapped(error)) if ((e as { code?: unknown }).code === code) return true;
  return false;
}

/** The first SQLSTATE that `error`, or an error it wraps (up to three deep), carries; undefined when none does. */
export function firstSqlState(error: unknown): string | undefined {
  for (const e of wrapped(error)) {
    const code = (e as { code?: unknown }).code;
    if (isSqlState(code)) return code;
  }
  return undefined;
}
