import { open, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import { isMap, isScalar, isSeq, parseDocument, Scalar } from 'yaml';
import { RuntimeFailure } from '../errors.js';
import { formatShardList, parseShardList } from './ranges.js';

/**
 * Moves shards from one host's list to another's in the config file, in place: comments, order and
 * formatting of everything else are kept (YAML via the yaml Document API; JSON is re-serialised).
 * The file is replaced atomically (write + rename), keeping its mode; a failed write leaves no
 * temporary file behind. Idempotent: shards that already belong to `to` change nothing.
 */
export async function rewriteShardOwner(
  file: string,
  shard: number | readonly number[],
  from: string,
  to: string,
): Promise<boolean> {
  // Moves between different host pairs run at the same time (runner locks are per host) and each
  // rewrites this one file: the read-modify-write is serialised by a lock file beside it.
  const release = await lockFile(`${file}.lock`);
  try {
    return await rewriteLocked(file, shard, from, to);
  } finally {
    await release();
  }
}

async function rewriteLocked(
  file: string,
  shard: number | readonly number[],
  from: string,
  to: string,
): Promise<boolean> {
  const text = await readFile(file, 'utf8');
  const updated = file.endsWith('.json') ? rewriteJson(text, shard, from, to) : rewriteYaml(text, shard, from, to);
  if (updated === null) return false;
  await replaceFile(file, updated);
  return true;
}

/**
 * Gives each listed shard to the host `owners` names (as `map pull` does from the fleet), adding a
 * host entry `{ name, url, shards }` for owners the file does not list. Same in-place rewrite, lock
 * and atomic replace as rewriteShardOwner. Returns whether the file changed.
 */
export async function rewriteOwners(
  file: string,
  owners: ReadonlyMap<number, string>,
  newHosts: readonly { name: string; url: string }[],
): Promise<boolean> {
  const release = await lockFile(`${file}.lock`);
  try {
    const text = await readFile(file, 'utf8');
    const updated = file.endsWith('.json')
      ? rewriteOwnersJson(text, owners, newHosts)
      : rewriteOwnersYaml(text, owners, newHosts);
    if (updated === null) return false;
    await replaceFile(file, updated);
    return true;
  } finally {
    await release();
  }
}

/** A host's new list: its shards the owners leave alone, plus those they give it. */
function ownedList(name: string, spec: string, owners: ReadonlyMap<number, string>): string {
  const current = listed(spec);
  const kept = current.filter((s) => (owners.get(s) ?? name) === name);
  const given = [...owners].filter(([, host]) => host === name).map(([s]) => s);
  return formatShardList([...new Set([...kept, ...given])].sort((a, b) => a - b));
}

export function rewriteOwnersYaml(
  text: string,
  owners: ReadonlyMap<number, string>,
  newHosts: readonly { name: string; url: string }[],
): string | null {
  const doc = parseDocument(text);
  const hosts = doc.get('hosts', true);
  if (!isSeq(hosts))
    throw new RuntimeFailure('CONFIG_REWRITE', 'cannot update the map: no hosts list in the config file');
  let changed = false;
  for (const item of hosts.items) {
    if (!isMap(item)) continue;
    const name = String(item.get('name'));
    const node = item.get('shards', true);
    // eslint-disable-next-line @typescript-eslint/no-base-to-string -- a YAML scalar's value is a string, number or boolean
    const spec = isScalar(node) ? String(node.value ?? '') : '';
    const next = ownedList(name, spec, owners);
    if (formatShardList(listed(spec)) === next) continue;
    const value = new Scalar(next);
    // Keep a list that reads like a number ("5") a string, as the file wrote it quoted or not.
    value.type = isScalar(node) && node.type === 'PLAIN' && !/^\d+$/.test(next) ? 'PLAIN' : 'QUOTE_DOUBLE';
    if (isScalar(node)) {
      value.comment = node.comment;
      value.commentBefore = node.commentBefore;
    }
    item.set('shards', value);
    changed = true;
  }
  for (const host of newHosts) {
    const shards = new Scalar(ownedList(host.name, '', owners));
    shards.type = 'QUOTE_DOUBLE';
    const entry = doc.createNode({ name: host.name, url: host.url, shards });
    entry.commentBefore =
      ' added by shardctl map pull: the fleet lists this host; add credentials to the url, or use PGUSER/PGPASSWORD/~/.pgpass';
    hosts.add(entry);
    changed = true;
  }
  return changed ? doc.toString() : null;
}

function rewriteOwnersJson(
  text: string,
  owners: ReadonlyMap<number, string>,
  newHosts: readonly { name: string; url: string }[],
): string | null {
  const data = JSON.parse(text) as { hosts?: { name?: string; url?: string; shards?: string | number }[] };
  let changed = false;
  for (const host of data.hosts ?? []) {
    const spec = host.shards === undefined ? '' : String(host.shards);
    const next = ownedList(String(host.name), spec, owners);
    if (formatShardList(listed(spec)) === next) continue;
    host.shards = next;
    changed = true;
  }
  for (const host of newHosts) {
    (data.hosts ??= []).push({ name: host.name, url: host.url, shards: ownedList(host.name, '', owners) });
    changed = true;
  }
  return changed ? `${JSON.stringify(data, null, 2)}\n` : null;
}

async function replaceFile(file: string, updated: string): Promise<void> {
  const mode = (await stat(file)).mode & 0o7777;
  const temp = `${file}.shardctl-${process.pid}.tmp`;
  try {
    await writeFile(temp, updated, { mode });
    await rename(temp, file);
  } catch (error) {
    // The write's error is the one to report; a temp file that cannot be removed either is only litter.
    await rm(temp, { force: true }).catch(() => undefined);
    throw error;
  }
}

/** The shards a host's list names ('' for none). */
function listed(spec: string): number[] {
  return spec.trim() === '' ? [] : parseOrFail(spec);
}

function parseOrFail(spec: string): number[] {
  const parsed = parseShardList(spec);
  if ('error' in parsed) throw new RuntimeFailure('CONFIG_REWRITE', `cannot update the map: ${parsed.error}`);
  return parsed.shards;
}

/** Moves `shard` to `to` in a YAML map (from whichever host lists it, normally `from`). */
export function rewriteYaml(text: string, shard: number | readonly number[], _from: string, to: string): string | null {
  return rewriteOwnersYaml(text, ownersOf(shard, to), []);
}

function rewriteJson(text: string, shard: number | readonly number[], _from: string, to: string): string | null {
  return rewriteOwnersJson(text, ownersOf(shard, to), []);
}

function ownersOf(shard: number | readonly number[], to: string): Map<number, string> {
  return new Map((typeof shard === 'number' ? [shard] : shard).map((s) => [s, to]));
}

/**
 * An exclusive lock file (O_EXCL) holding the owner's pid. A lock whose owner is gone (no such
 * process on this machine) or older than a minute is taken over by renaming it away first: only one
 * waiter's rename succeeds, so two waiters cannot both break the same stale lock.
 */
async function lockFile(path: string, timeoutMs = 90_000): Promise<() => Promise<void>> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      const handle = await open(path, 'wx');
      await handle.writeFile(`${process.pid}\n`);
      await handle.close();
      return () => rm(path, { force: true });
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw error;
    }
    if (await isStale(path)) {
      const aside = `${path}.stale-${process.pid}-${Date.now()}`;
      await rename(path, aside).then(
        () => rm(aside, { force: true }),
        () => undefined, // another waiter took it first
      );
      continue;
    }
    if (Date.now() > deadline) {
      throw new RuntimeFailure(
        'CONFIG_LOCKED',
        `cannot update the map: ${path} is held by another shardctl process; remove it if none is running`,
      );
    }
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
}

async function isStale(path: string): Promise<boolean> {
  try {
    const [text, info] = await Promise.all([readFile(path, 'utf8'), stat(path)]);
    if (Date.now() - info.mtimeMs > 60_000) return true;
    const pid = Number(text.trim());
    if (!Number.isInteger(pid) || pid <= 0) return false; // being written right now
    process.kill(pid, 0);
    return false;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'ESRCH';
  }
}
