/**
 * A counting semaphore with a FIFO queue: at most `size` holders at a time, waiters served in the
 * order they asked, so one busy host cannot starve the others of the fan-out's overall limit.
 */
export class Limit {
  private active = 0;
  private readonly waiting: (() => void)[] = [];

  constructor(readonly size: number) {
    if (!Number.isSafeInteger(size) || size < 1) throw new RangeError(`limit ${size} must be a positive integer`);
  }

  async run<T>(fn: () => Promise<T>): Promise<T> {
    if (this.active >= this.size) await new Promise<void>((resolve) => this.waiting.push(resolve));
    else this.active += 1;
    try {
      return await fn();
    } finally {
      const next = this.waiting.shift();
      // The slot passes straight to the next waiter; `active` only drops when nobody waits.
      if (next) next();
      else this.active -= 1;
    }
  }
}
