/** Whole milliseconds since `started`, a performance.now() reading: what timings in results report. */
export function elapsed(started: number): number {
  return Math.round(performance.now() - started);
}

/** Resolves after `ms` milliseconds: the pause between polls and retries. */
export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
