/**
 * A promise started before its outcome is wanted (reads sent at once, queued on their sessions):
 * its failure is seen where it is awaited, and not reported as unhandled meanwhile.
 */
export function awaitedLater<T>(promise: Promise<T>): Promise<T> {
  promise.catch(() => undefined);
  return promise;
}

/**
 * Resources opened at once (connections), from their settled outcomes: all of them; or, when any
 * failed, the others closed with `close` and the first failure (in order) thrown.
 */
export async function allOrNone<T>(
  settling: Promise<readonly PromiseSettledResult<T>[]>,
  close: (value: T) => Promise<void>,
): Promise<T[]> {
  const settled = await settling;
  const values = settled.flatMap((o) => (o.status === 'fulfilled' ? [o.value] : []));
  const failed = settled.find((o): o is PromiseRejectedResult => o.status === 'rejected');
  if (!failed) return values;
  await Promise.all(values.map(close));
  throw failed.reason;
}
