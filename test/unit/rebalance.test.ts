import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { formatShardList } from '../../src/config/ranges.js';
import { planRebalance, type RebalanceBy, type RebalanceHost, type RebalancePlan } from '../../src/moves/rebalance.js';

const range = (first: number, last: number): number[] => Array.from({ length: last - first + 1 }, (_, i) => first + i);
const host = (name: string, shards: number[], extra: Partial<RebalanceHost> = {}): RebalanceHost => ({
  name,
  weight: 1,
  drain: false,
  shards,
  ...extra,
});
const uniform = (shards: number, bytes = 8192n): Map<number, bigint> =>
  new Map(range(0, shards - 1).map((s) => [s, bytes]));
const table = (plan: RebalancePlan) =>
  plan.moves.map((m) => `${m.source} → ${m.target}: ${formatShardList([...m.shards])} (${m.bytes})`);

/** The map after the plan: host → shards; fails if a move takes a shard its source does not hold. */
function apply(hosts: readonly RebalanceHost[], plan: RebalancePlan): Map<string, Set<number>> {
  const map = new Map(hosts.map((h) => [h.name, new Set(h.shards)]));
  for (const move of plan.moves) {
    for (const shard of move.shards) {
      expect(map.get(move.source)!.has(shard), `shard ${shard} is not on ${move.source}`).toBe(true);
      map.get(move.source)!.delete(shard);
      map.get(move.target)!.add(shard);
    }
  }
  return map;
}

describe('planRebalance by count', () => {
  it('fills a new host from both old ones, taking the highest shards so the lists stay ranges', () => {
    const hosts = [host('pg1', range(0, 5)), host('pg2', range(6, 11)), host('pg3', [])];
    const plan = planRebalance(hosts, uniform(12), 'count');
    expect(table(plan)).toEqual(['pg1 → pg3: 4-5 (16384)', 'pg2 → pg3: 10-11 (16384)']);
    expect(plan.hosts.map((h) => [h.host, h.shardsBefore, h.shardsAfter])).toEqual([
      ['pg1', 6, 4],
      ['pg2', 6, 4],
      ['pg3', 0, 4],
    ]);
    expect(plan.shardsMoved).toBe(4);
    expect(plan.bytesMoved).toBe(32768n);
  });

  it('moves the smallest shards of a host that gives', () => {
    const sizes = uniform(8, 100n);
    sizes.set(6, 10n);
    sizes.set(1, 20n);
    const plan = planRebalance([host('pg1', range(0, 7)), host('pg2', [])], sizes, 'count');
    expect(table(plan)).toEqual(['pg1 → pg2: 1,5-7 (230)']);
  });

  it('empties a draining host onto the others, respecting weights', () => {
    const hosts = [
      host('pg1', range(0, 3)),
      host('pg2', range(4, 7), { weight: 2 }),
      host('pg3', range(8, 11), { drain: true }),
    ];
    const plan = planRebalance(hosts, uniform(12), 'count');
    const after = apply(hosts, plan);
    expect([...after.get('pg3')!]).toEqual([]);
    expect(after.get('pg1')!.size).toBe(4);
    expect(after.get('pg2')!.size).toBe(8);
    expect(table(plan)).toEqual(['pg3 → pg2: 8-11 (32768)']);
    expect(plan.hosts.map((h) => h.idealShards)).toEqual([4, 8, 0]);
  });

  it('gives the extra shard of an uneven split to a host that already has it, saving a move', () => {
    // 7 shards over 2 hosts: one gets 4. pg2 holds 4 already, so nothing moves.
    expect(planRebalance([host('pg1', range(0, 2)), host('pg2', range(3, 6))], uniform(7), 'count').moves).toEqual([]);
  });

  it('plans nothing for a balanced fleet', () => {
    const plan = planRebalance([host('pg1', range(0, 3)), host('pg2', range(4, 7))], uniform(8), 'count');
    expect(plan.moves).toEqual([]);
    expect(plan.shardsMoved).toBe(0);
    expect(plan.bytesMoved).toBe(0n);
  });

  it('is deterministic', () => {
    const hosts = [
      host('a', range(0, 40)),
      host('b', range(41, 50), { weight: 1.5 }),
      host('c', [], { weight: 0.5 }),
      host('d', range(51, 60), { drain: true }),
    ];
    const sizes = new Map(range(0, 60).map((s) => [s, BigInt((s * 7919) % 1000)]));
    expect(planRebalance(hosts, sizes, 'count')).toEqual(planRebalance(hosts, sizes, 'count'));
    expect(planRebalance(hosts, sizes, 'size')).toEqual(planRebalance(hosts, sizes, 'size'));
  });
});

describe('planRebalance by size', () => {
  it('moves the largest shard that fits the gap instead of many small ones', () => {
    // pg1 holds 1000 bytes, pg2 none: the share is 500 each; shard 0 (500 bytes) is exactly the gap.
    const sizes = new Map<number, bigint>([
      [0, 500n],
      [1, 100n],
      [2, 100n],
      [3, 100n],
      [4, 100n],
      [5, 100n],
    ]);
    const plan = planRebalance([host('pg1', range(0, 5)), host('pg2', [])], sizes, 'size');
    expect(table(plan)).toEqual(['pg1 → pg2: 0 (500)']);
    expect(plan.hosts.map((h) => [h.host, h.bytesAfter, h.idealBytes])).toEqual([
      ['pg1', 500n, 500n],
      ['pg2', 500n, 500n],
    ]);
  });

  it('leaves a host above its share when the only shard it could give is bigger than both gaps together', () => {
    const sizes = new Map<number, bigint>([
      [0, 900n],
      [1, 100n],
    ]);
    expect(planRebalance([host('pg1', [0, 1]), host('pg2', [])], sizes, 'size').moves).toEqual([
      { source: 'pg1', target: 'pg2', shards: [1], bytes: 100n },
    ]);
  });

  it('balances empty shards by count (an empty shard weighs one byte)', () => {
    const plan = planRebalance(
      [host('pg1', range(0, 7)), host('pg2', range(8, 15)), host('pg3', []), host('pg4', [])],
      uniform(16, 0n),
      'size',
    );
    const after = apply([host('pg1', range(0, 7)), host('pg2', range(8, 15)), host('pg3', []), host('pg4', [])], plan);
    expect([...after.values()].map((s) => s.size)).toEqual([4, 4, 4, 4]);
  });

  it('sends a draining host’s shards, the largest first, to whoever is furthest below its share', () => {
    const sizes = new Map<number, bigint>([
      [0, 100n],
      [1, 100n],
      [2, 300n],
      [3, 50n],
      [4, 50n],
    ]);
    const hosts = [host('pg1', [0]), host('pg2', [1]), host('pg3', [2, 3, 4], { drain: true })];
    const plan = planRebalance(hosts, sizes, 'size');
    expect(table(plan)).toEqual(['pg3 → pg1: 2 (300)', 'pg3 → pg2: 3-4 (100)']);
  });
});

// ---------------------------------------------------------------------------------------------
// Properties, over random maps, weights, drains and sizes

const fleets = fc
  .record({
    shards: fc.integer({ min: 1, max: 120 }),
    hosts: fc.array(fc.record({ weight: fc.constantFrom(0.5, 1, 1, 2, 3.25), drain: fc.boolean() }), {
      minLength: 1,
      maxLength: 6,
    }),
    seed: fc.array(fc.nat(), { minLength: 120, maxLength: 120 }),
    sizes: fc.array(fc.bigInt({ min: 0n, max: 10_000_000_000n }), { minLength: 120, maxLength: 120 }),
    by: fc.constantFrom<RebalanceBy>('count', 'size'),
  })
  .map(({ shards, hosts, seed, sizes, by }) => {
    const specs = hosts.every((h) => h.drain) ? [{ ...hosts[0]!, drain: false }, ...hosts.slice(1)] : hosts;
    const lists: number[][] = specs.map(() => []);
    // Most shards on the first hosts, some hosts empty: the shapes rebalancing meets.
    for (let s = 0; s < shards; s++) lists[seed[s]! % Math.min(specs.length, 1 + (seed[s]! % 3))]!.push(s);
    return {
      by,
      hosts: specs.map((spec, i) => host(`h${i}`, lists[i]!, spec)),
      sizes: new Map(range(0, shards - 1).map((s) => [s, sizes[s]!])),
    };
  });

describe('planRebalance properties', () => {
  it('after the plan every shard is on exactly one host, draining hosts are empty, and no shard moves twice', () => {
    fc.assert(
      fc.property(fleets, ({ hosts, sizes, by }) => {
        const plan = planRebalance(hosts, sizes, by);
        const after = apply(hosts, plan);
        const all = [...after.values()].flatMap((s) => [...s]).sort((a, b) => a - b);
        expect(all).toEqual(range(0, sizes.size - 1));
        for (const h of hosts) if (h.drain) expect(after.get(h.name)!.size, `${h.name} drains`).toBe(0);
        const moved = plan.moves.flatMap((m) => m.shards);
        expect(new Set(moved).size).toBe(moved.length);
        expect(plan.shardsMoved).toBe(moved.length);
        for (const m of plan.moves) {
          expect(m.source).not.toBe(m.target);
          expect(hosts.find((h) => h.name === m.target)!.drain).toBe(false);
          expect(m.bytes).toBe(m.shards.reduce((n, s) => n + sizes.get(s)!, 0n));
        }
        expect(new Set(plan.moves.map((m) => `${m.source}/${m.target}`)).size).toBe(plan.moves.length);
      }),
      { numRuns: 300 },
    );
  });

  it('by count: every host that is not draining ends within one shard of its weighted share, with the fewest moves', () => {
    fc.assert(
      fc.property(fleets, ({ hosts, sizes }) => {
        const plan = planRebalance(hosts, sizes, 'count');
        const after = apply(hosts, plan);
        const total = sizes.size;
        const weights = hosts.filter((h) => !h.drain).reduce((n, h) => n + h.weight, 0);
        for (const h of hosts) {
          const ideal = h.drain ? 0 : (total * h.weight) / weights;
          expect(
            Math.abs(after.get(h.name)!.size - ideal),
            `${h.name}: ${after.get(h.name)!.size} vs ${ideal}`,
          ).toBeLessThan(1 + 1e-9);
        }
        // The fewest moves: every host gives what it holds above the floor of its share, except that
        // the ceilings left over (one each) go to hosts already holding that many.
        const scaled = hosts.map((h) => (h.drain ? 0n : BigInt(Math.round(h.weight * 1e6))));
        const sum = scaled.reduce((n, w) => n + w, 0n);
        const floors = scaled.map((w) => Number((BigInt(total) * w) / sum));
        const fractional = scaled.map((w) => (BigInt(total) * w) % sum > 0n);
        const ceilings = total - floors.reduce((n, f) => n + f, 0);
        const aboveFloor = hosts.reduce((n, h, i) => n + Math.max(0, h.shards.length - floors[i]!), 0);
        const holdCeiling = hosts.filter((h, i) => fractional[i] && h.shards.length > floors[i]!).length;
        expect(plan.shardsMoved).toBe(aboveFloor - Math.min(ceilings, holdCeiling));
      }),
      { numRuns: 300 },
    );
  });

  it('by count: planning again from the map the plan leaves moves nothing (a rerun finishes, never starts over)', () => {
    fc.assert(
      fc.property(fleets, ({ hosts, sizes }) => {
        const after = apply(hosts, planRebalance(hosts, sizes, 'count'));
        const next = hosts.map((h) => ({ ...h, shards: [...after.get(h.name)!].sort((a, b) => a - b) }));
        expect(planRebalance(next, sizes, 'count').moves).toEqual([]);
      }),
      { numRuns: 300 },
    );
  });

  it('by count: planning again after part of the plan ran moves no shard back', () => {
    fc.assert(
      fc.property(fleets, fc.nat(), ({ hosts, sizes }, cut) => {
        const plan = planRebalance(hosts, sizes, 'count');
        const done = { ...plan, moves: plan.moves.slice(0, plan.moves.length === 0 ? 0 : cut % plan.moves.length) };
        const partial = apply(hosts, done);
        const next = hosts.map((h) => ({ ...h, shards: [...partial.get(h.name)!].sort((a, b) => a - b) }));
        const rest = planRebalance(next, sizes, 'count');
        const movedBefore = new Set(done.moves.flatMap((m) => m.shards));
        for (const m of rest.moves)
          for (const s of m.shards) expect(movedBefore.has(s), `shard ${s} moved again`).toBe(false);
        expect(done.moves.reduce((n, m) => n + m.shards.length, 0) + rest.shardsMoved).toBe(plan.shardsMoved);
      }),
      { numRuns: 300 },
    );
  });

  it('by size: without draining hosts, the plan never widens the spread around the shares', () => {
    fc.assert(
      fc.property(fleets, ({ hosts, sizes }) => {
        const steady = hosts.map((h) => ({ ...h, drain: false }));
        const plan = planRebalance(steady, sizes, 'size');
        const spread = (bytes: (h: (typeof plan.hosts)[number]) => bigint) =>
          plan.hosts.reduce((n, h) => {
            const d = bytes(h) - h.idealBytes;
            return n + d * d;
          }, 0n);
        expect(spread((h) => h.bytesAfter)).toBeLessThanOrEqual(spread((h) => h.bytesBefore));
      }),
      { numRuns: 300 },
    );
  });
});

describe('planRebalance by load', () => {
  it('spreads the busiest shards over the hosts by their writes and reads, reporting bytes as bytes', () => {
    const hosts = [host('pg1', range(0, 3)), host('pg2', range(4, 7))];
    // Shards 0 and 1 take nearly all the traffic, both on pg1; sizes are equal.
    const load = new Map([
      [0, 1000n],
      [1, 900n],
      [2, 5n],
      [3, 5n],
      [4, 5n],
      [5, 5n],
      [6, 5n],
      [7, 5n],
    ]);
    const plan = planRebalance(hosts, uniform(8), 'load', load);
    expect(plan.by).toBe('load');
    const after = apply(hosts, plan);
    const holder = (shard: number) => [...after].find(([, shards]) => shards.has(shard))![0];
    expect(holder(0)).not.toBe(holder(1));
    // By count or size the same map is balanced already: nothing moves.
    expect(planRebalance(hosts, uniform(8), 'size', load).moves).toEqual([]);
    expect(planRebalance(hosts, uniform(8), 'count', load).moves).toEqual([]);
    // Bytes are still bytes.
    expect(plan.bytesMoved).toBe(8192n * BigInt(plan.shardsMoved));
  });
});
