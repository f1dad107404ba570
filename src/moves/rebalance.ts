/**
 * The rebalance planner: from the map (each host's shards, weight and drain flag) and the shard
 * sizes, the moves that give every host that is not draining its weighted share, empty the draining
 * hosts and fill new ones, moving as little as possible. Pure and deterministic: the same map and
 * sizes give the same plan, so a rerun after an interruption plans what is left from the map the
 * finished moves rewrote.
 *
 * Weights are fractional; shares are computed exactly in bigint with the weights scaled to
 * millionths (a weight below 0.000001 counts as 0.000001).
 */

/** count: shards; size: bytes on disk; load: rows written and read (status --load), bytes still reported. */
export type RebalanceBy = 'count' | 'size' | 'load';

export interface RebalanceHost {
  readonly name: string;
  readonly weight: number;
  readonly drain: boolean;
  readonly shards: readonly number[];
}

/** One batched move of the plan: shards from one host to another. */
export interface PlannedMove {
  readonly source: string;
  readonly target: string;
  /** Ascending. */
  readonly shards: readonly number[];
  readonly bytes: bigint;
}

export interface RebalanceHostPlan {
  readonly host: string;
  readonly weight: number;
  readonly drain: boolean;
  readonly shardsBefore: number;
  readonly shardsAfter: number;
  readonly bytesBefore: bigint;
  readonly bytesAfter: bigint;
  /** The host's weighted share of the shards (0 when draining); a fraction. */
  readonly idealShards: number;
  /** The host's weighted share of the bytes (0 when draining), rounded down. */
  readonly idealBytes: bigint;
}

export interface RebalancePlan {
  readonly by: RebalanceBy;
  /** By source, then target, in the map's host order. */
  readonly moves: readonly PlannedMove[];
  readonly hosts: readonly RebalanceHostPlan[];
  readonly shardsMoved: number;
  readonly bytesMoved: bigint;
}

const WEIGHT_SCALE = 1_000_000;

interface Working {
  readonly index: number;
  readonly host: RebalanceHost;
  /** Scaled weight; 0 for a draining host. */
  readonly weight: bigint;
  load: bigint;
  count: number;
}

export function planRebalance(
  hosts: readonly RebalanceHost[],
  sizes: ReadonlyMap<number, bigint>,
  by: RebalanceBy,
  /** By load: each shard's writes + reads; the busiest spread as the largest are by size. */
  load?: ReadonlyMap<number, bigint>,
): RebalancePlan {
  const bytesOf = (shard: number): bigint => sizes.get(shard) ?? 0n;
  const loadOf = (shard: number): bigint => load?.get(shard) ?? 0n;
  const work: Working[] = hosts.map((host, index) => ({
    index,
    host,
    weight: host.drain ? 0n : BigInt(Math.max(1, Math.round(host.weight * WEIGHT_SCALE))),
    load: 0n,
    count: host.shards.length,
  }));
  const totalWeight = work.reduce((n, w) => n + w.weight, 0n);
  if (totalWeight === 0n) throw new Error('planRebalance: every host is draining');
  const moves =
    by === 'count'
      ? planByCount(work, totalWeight, bytesOf)
      : planBySize(work, totalWeight, by === 'load' ? loadOf : bytesOf);

  // One batched move per (source, target), in host order.
  const pairs = new Map<string, { source: Working; target: Working; shards: number[] }>();
  for (const { shard, source, target } of moves) {
    const key = `${source.index}/${target.index}`;
    let pair = pairs.get(key);
    if (!pair) pairs.set(key, (pair = { source, target, shards: [] }));
    pair.shards.push(shard);
  }
  const planned = [...pairs.values()]
    .sort((a, b) => a.source.index - b.source.index || a.target.index - b.target.index)
    .map(({ source, target, shards }) => {
      const sorted = shards.sort((a, b) => a - b);
      return {
        source: source.host.name,
        target: target.host.name,
        shards: sorted,
        bytes: sorted.reduce((n, s) => n + bytesOf(s), 0n),
      };
    });

  const totalShards = hosts.reduce((n, h) => n + h.shards.length, 0);
  const totalBytes = hosts.reduce((n, h) => n + h.shards.reduce((m, s) => m + bytesOf(s), 0n), 0n);
  const outgoing = new Map<string, bigint>();
  const incoming = new Map<string, bigint>();
  const outCount = new Map<string, number>();
  const inCount = new Map<string, number>();
  for (const move of planned) {
    outgoing.set(move.source, (outgoing.get(move.source) ?? 0n) + move.bytes);
    incoming.set(move.target, (incoming.get(move.target) ?? 0n) + move.bytes);
    outCount.set(move.source, (outCount.get(move.source) ?? 0) + move.shards.length);
    inCount.set(move.target, (inCount.get(move.target) ?? 0) + move.shards.length);
  }
  const hostPlans = work.map((w): RebalanceHostPlan => {
    const name = w.host.name;
    const bytesBefore = w.host.shards.reduce((n, s) => n + bytesOf(s), 0n);
    return {
      host: name,
      weight: w.host.weight,
      drain: w.host.drain,
      shardsBefore: w.host.shards.length,
      shardsAfter: w.host.shards.length - (outCount.get(name) ?? 0) + (inCount.get(name) ?? 0),
      bytesBefore,
      bytesAfter: bytesBefore - (outgoing.get(name) ?? 0n) + (incoming.get(name) ?? 0n),
      idealShards: Number((BigInt(totalShards) * w.weight * 1_000_000n) / totalWeight) / 1_000_000,
      idealBytes: (totalBytes * w.weight) / totalWeight,
    };
  });
  return {
    by,
    moves: planned,
    hosts: hostPlans,
    shardsMoved: moves.length,
    bytesMoved: planned.reduce((n, m) => n + m.bytes, 0n),
  };
}

interface ShardMove {
  readonly shard: number;
  readonly source: Working;
  readonly target: Working;
}

/**
 * By count: each host that is not draining gets floor or ceil of its share; the ceilings go first to
 * hosts that already hold that many (each saves a move), then to those closest to it, then to the
 * larger remainder, then in map order. Every surplus shard moves once, the smallest first (and among
 * equal sizes the highest numbers, so ranges stay ranges), to receivers in map order.
 */
function planByCount(work: Working[], totalWeight: bigint, bytesOf: (shard: number) => bigint): ShardMove[] {
  const total = BigInt(work.reduce((n, w) => n + w.count, 0));
  const quota = new Map<Working, number>();
  const candidates: { w: Working; floor: number; remainder: bigint }[] = [];
  let given = 0;
  for (const w of work) {
    if (w.weight === 0n) {
      quota.set(w, 0);
      continue;
    }
    const floor = Number((total * w.weight) / totalWeight);
    const remainder = (total * w.weight) % totalWeight;
    quota.set(w, floor);
    given += floor;
    if (remainder > 0n) candidates.push({ w, floor, remainder });
  }
  const closeness = (c: { w: Working; floor: number }): number => Math.min(c.w.count - c.floor, 1);
  candidates.sort(
    (a, b) =>
      closeness(b) - closeness(a) ||
      (b.remainder > a.remainder ? 1 : b.remainder < a.remainder ? -1 : 0) ||
      a.w.index - b.w.index,
  );
  for (const c of candidates.slice(0, Number(total) - given)) quota.set(c.w, c.floor + 1);

  const leaving: { shard: number; source: Working }[] = [];
  for (const w of work) {
    const surplus = w.count - quota.get(w)!;
    if (surplus <= 0) continue;
    const chosen = [...w.host.shards].sort((a, b) => compareBigint(bytesOf(a), bytesOf(b)) || b - a).slice(0, surplus);
    for (const shard of chosen) leaving.push({ shard, source: w });
  }
  const moves: ShardMove[] = [];
  let next = 0;
  for (const target of work) {
    const deficit = quota.get(target)! - target.count;
    for (let i = 0; i < deficit; i++) {
      const { shard, source } = leaving[next++]!;
      moves.push({ shard, source, target });
    }
  }
  return moves;
}

/**
 * By size (bytes on disk; an empty shard counts as one byte, so a fleet of empty shards balances by
 * count): a draining host's shards go, the largest first, to the host furthest below its share. Then,
 * while a host is above its share and another below, the largest shard that fits in both gaps moves
 * (every byte moved closes the gap by a byte); failing that, the smallest shard that still brings the
 * pair closer. A host that gave never receives and one that received never gives, and a shard moves
 * at most once, so the loop ends and nothing travels twice.
 */
function planBySize(work: Working[], totalWeight: bigint, bytesOf: (shard: number) => bigint): ShardMove[] {
  const cost = (shard: number): bigint => {
    const bytes = bytesOf(shard);
    return bytes > 0n ? bytes : 1n;
  };
  for (const w of work) w.load = w.host.shards.reduce((n, s) => n + cost(s), 0n);
  const totalCost = work.reduce((n, w) => n + w.load, 0n);
  // Scaled by totalWeight so that shares stay whole numbers.
  const deviation = (w: Working): bigint => w.load * totalWeight - totalCost * w.weight;
  const moves: ShardMove[] = [];
  const gave = new Set<Working>();
  const received = new Set<Working>();
  // Each host's own shards not yet moved, ascending by cost: a shard moves at most once.
  const remaining = new Map<Working, number[]>();
  const transfer = (shard: number, source: Working, target: Working): void => {
    moves.push({ shard, source, target });
    const left = remaining.get(source);
    left?.splice(left.indexOf(shard), 1);
    source.load -= cost(shard);
    target.load += cost(shard);
    source.count -= 1;
    target.count += 1;
    gave.add(source);
    received.add(target);
  };
  const byCostThenNumber = (a: number, b: number): number => compareBigint(cost(a), cost(b)) || a - b;

  const takers = work.filter((w) => w.weight > 0n);
  for (const source of work.filter((w) => w.weight === 0n)) {
    for (const shard of [...source.host.shards].sort((a, b) => byCostThenNumber(b, a))) {
      const target = takers.reduce((best, w) => (deviation(w) < deviation(best) ? w : best));
      transfer(shard, source, target);
    }
  }

  for (const w of takers) remaining.set(w, [...w.host.shards].sort(byCostThenNumber));
  for (;;) {
    const over = takers
      .filter((w) => !received.has(w) && deviation(w) > 0n)
      .sort((a, b) => compareBigint(deviation(b), deviation(a)) || a.index - b.index);
    const under = takers
      .filter((w) => !gave.has(w) && deviation(w) < 0n)
      .sort((a, b) => compareBigint(deviation(a), deviation(b)) || a.index - b.index);
    const pick = choose(over, under, (w) => remaining.get(w)!, cost, totalWeight, deviation);
    if (!pick) break;
    transfer(pick.shard, pick.source, pick.target);
  }
  return moves;
}

function choose(
  over: readonly Working[],
  under: readonly Working[],
  shardsOf: (w: Working) => readonly number[],
  cost: (shard: number) => bigint,
  totalWeight: bigint,
  deviation: (w: Working) => bigint,
): { shard: number; source: Working; target: Working } | undefined {
  // First a shard that fits both gaps (the largest); then one that at least narrows them (the smallest).
  for (const fits of [true, false]) {
    for (const source of over) {
      const shards = shardsOf(source); // ascending by cost
      for (const target of under) {
        const above = deviation(source);
        const below = -deviation(target);
        if (fits) {
          const limit = above < below ? above : below;
          const shard = largestAtMost(shards, (s) => cost(s) * totalWeight <= limit);
          if (shard !== undefined) return { shard, source, target };
        } else {
          // Moving c changes the squared gaps by 2c(c - above - below) (scaled): better when c < above + below.
          const shard = shards[0];
          if (shard !== undefined && cost(shard) * totalWeight < above + below) return { shard, source, target };
        }
      }
    }
  }
  return undefined;
}

/** The last item of an ascending list that satisfies a condition true of a prefix of it. */
function largestAtMost(ascending: readonly number[], fits: (shard: number) => boolean): number | undefined {
  let lo = 0;
  let hi = ascending.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (fits(ascending[mid]!)) lo = mid + 1;
    else hi = mid;
  }
  return lo === 0 ? undefined : ascending[lo - 1];
}

function compareBigint(a: bigint, b: bigint): number {
  return a === b ? 0 : a < b ? -1 : 1;
}
