/** The config's duration format (lockTimeout, hostTimeout): '500ms', '5s', '1min'. PostgreSQL accepts the same text. */
export const DURATION = /^(\d+)(ms|s|min)$/;

/** A duration in that format, in milliseconds. */
export function durationMs(text: string): number {
  const match = DURATION.exec(text);
  if (!match) throw new Error(`not a duration: ${JSON.stringify(text)}`);
  return Number(match[1]) * (match[2] === 'ms' ? 1 : match[2] === 's' ? 1000 : 60_000);
}
