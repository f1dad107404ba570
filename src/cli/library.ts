/**
 * The package root as the CLI uses it, loaded when a command runs rather than at start-up: parsing
 * argv, `--help`, `--version` and usage errors need none of it, and loading it (pg, yaml, every
 * engine) costs more than the rest of a `shardctl --help`. main.ts loads it in a preAction hook,
 * so every command's action, and everything it calls, can use lib().
 */
export type Library = typeof import('../index.js');

let loaded: Library | undefined;

export async function loadLibrary(): Promise<Library> {
  loaded ??= await withNavigator(() => import('../index.js'));
  return loaded;
}

/** The loaded library; only after loadLibrary() (a command's action always is). */
export function lib(): Library {
  if (!loaded) throw new Error('internal error: the shardctl library is used before it was loaded');
  return loaded;
}

/**
 * pg 8 tells a Cloudflare Worker from Node by `navigator.userAgent`, and where there is no navigator
 * (Node 20) by building a fetch Response, which loads undici: a cost on every command for nothing.
 * Node >= 21 has a navigator; on 20 one stands in while pg is loaded, then goes.
 */
async function withNavigator<T>(load: () => Promise<T>): Promise<T> {
  if ((globalThis as { navigator?: unknown }).navigator !== undefined) return load();
  const userAgent = `Node.js/${process.versions.node.split('.')[0]}`;
  Object.defineProperty(globalThis, 'navigator', { value: { userAgent }, configurable: true });
  try {
    return await load();
  } finally {
    delete (globalThis as { navigator?: unknown }).navigator;
  }
}
