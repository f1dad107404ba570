/** Whole milliseconds since `started`, a performance.now() reading: what timings in results report. */
export function elapsed(started: number): number {
  return Math.round(performance.now() - started);
}
