/**
 * A promise started before its outcome is wanted (reads sent at once, queued on their sessions):
 * its failure is seen where it is awaited, and not reported as unhandled meanwhile.
 */
export function awaitedLater<T>(promise: Promise<T>): Promise<T> {
  promise.catch(() => undefined);
  return promise;
}
