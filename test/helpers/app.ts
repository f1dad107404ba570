/**
 * An application in a process of its own (test/fixtures/app-writer.ts): a ShardRouter opened from a
 * config file or seed URLs, writing by key until told to stop, each call reported as a JSON line.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import path from 'node:path';

const ROOT = path.join(import.meta.dirname, '..', '..');
const WRITER = path.join(ROOT, 'test', 'fixtures', 'app-writer.ts');

export interface Call {
  ok: boolean;
  id?: string;
  host?: string;
  error?: string;
}

/** An application process writing by `key` through a router opened from `source`. */
export function startApp(
  source: string,
  key: number,
  count?: number,
): { child: ChildProcess; calls: Call[]; stop(): Promise<Call[]>; stderr: () => string } {
  const child = spawn(
    process.execPath,
    ['--import', 'tsx', WRITER, source, String(key), ...(count === undefined ? [] : [String(count)])],
    {
      cwd: ROOT,
      stdio: ['pipe', 'pipe', 'pipe'],
    },
  );
  const calls: Call[] = [];
  let buffered = '';
  let errors = '';
  child.stdout!.on('data', (chunk: Buffer) => {
    buffered += chunk.toString();
    const lines = buffered.split('\n');
    buffered = lines.pop()!;
    for (const line of lines) if (line.trim()) calls.push(JSON.parse(line) as Call);
  });
  child.stderr!.on('data', (chunk: Buffer) => (errors += chunk.toString()));
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  return {
    child,
    calls,
    stderr: () => errors,
    async stop() {
      child.stdin!.end();
      await exited;
      return calls;
    },
  };
}

export async function waitForCalls(app: { calls: Call[]; stderr: () => string }, atLeast: number): Promise<void> {
  const deadline = Date.now() + 30_000;
  while (app.calls.filter((c) => c.ok).length < atLeast) {
    if (Date.now() > deadline) throw new Error(`the application made ${app.calls.length} calls: ${app.stderr()}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}
