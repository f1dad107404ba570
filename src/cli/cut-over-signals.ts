/**
 * SIGINT and SIGTERM during a move's cut-over. Elsewhere they stop a command at once
 * (bin/shardctl.js): every step can be resumed or undone. While a wave refuses writes (fenced, its
 * switch not sent) stopping at once would leave it refusing them until someone runs --resume or
 * --abort: what `timeout`, systemd and Kubernetes send would be an outage. So there the move is
 * asked to stop (MoveOptions.signal): it makes the wave writable again (back at `synced`), and then
 * the command stops as it would have, with the signal's exit code. A second signal stops it at once.
 */

import { lib } from './library.js';

/** The longest the release is waited for before the command stops anyway. */
const RELEASE_WAIT_MS = 60_000;

export interface CutOverSignals {
  readonly signal: AbortSignal;
  /** Runs the move; a stop asked during the cut-over ends the command once the move has ended. */
  run<T>(move: Promise<T>): Promise<T>;
}

export function cutOverSignals(warn: (text: string) => void): CutOverSignals {
  const controller = new AbortController();
  let received: NodeJS.Signals | undefined;
  /**
   * The launcher's own handler stops the command (it is the signal's only listener again), called
   * at once: a signal sent again would arrive after the process ended with nothing left to run.
   */
  const stopNow = (signal: NodeJS.Signals): void => {
    remove();
    (process.emit as (event: string, signal: string) => boolean)(signal, signal);
  };
  const handlers = (['SIGINT', 'SIGTERM'] as const).map((signal) => {
    const handler = (): void => {
      if (received !== undefined || !lib().cutOverUnderway(controller.signal)) return stopNow(signal);
      received = signal;
      warn(
        `${signal}: making the fenced shards writable again before stopping (send it again to stop at once; they would then refuse writes until --resume or --abort)`,
      );
      controller.abort();
      setTimeout(() => stopNow(signal), RELEASE_WAIT_MS).unref();
    };
    process.on(signal, handler);
    return [signal, handler] as const;
  });
  const remove = (): void => {
    for (const [signal, handler] of handlers) process.off(signal, handler);
  };
  return {
    signal: controller.signal,
    run: async (move) => {
      try {
        return await move;
      } catch (error) {
        if (received === undefined) throw error;
        // Released (its notice said so) or not: the command stops as the signal asks.
        stopNow(received);
        return await new Promise<never>(() => {});
      } finally {
        if (received === undefined) remove();
      }
    },
  };
}
