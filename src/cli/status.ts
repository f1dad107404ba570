import type { Command } from 'commander';
import type { LoadResult, SizesResult, StatusResult } from '../index.js';
import { lib } from './library.js';
import { type CliContext, loadCliConfig } from './context.js';
import { type CommonFlags, configOption, jsonOption } from './options.js';
import { columns, formatBytes, nextLine, Output } from './output.js';

export function registerStatus(program: Command, ctx: CliContext, done: (code: number) => void): void {
  const command = program
    .command('status')
    .description(
      'per host: shards expected / present / missing / misplaced, migration levels and drift; exit 3 when anything is off',
    )
    .option('--sizes', 'instead: bytes on disk and estimated rows per host and per shard, the largest shards first')
    .option(
      '--load',
      'instead: rows written and read per host and per shard since the last statistics reset (pg_stat_user_tables), the busiest first',
    );
  [configOption, jsonOption].forEach((add) => add(command));
  command.action(async (options: CommonFlags & { sizes?: boolean; load?: boolean }) => {
    const { formatShardList, shardLoad, shardSizes, status, UsageError } = lib();
    const out = new Output(ctx.streams, options.json ?? false);
    if (options.sizes && options.load)
      throw new UsageError('give --sizes or --load, not both', { input: 'option --load' });
    const config = await loadCliConfig(ctx, options, out);
    // --load and --sizes show what the hosts that can be read say; the others are named, exit 1.
    if (options.load || options.sizes) {
      const figures = options.load
        ? await shardLoad(config, { partial: true })
        : await shardSizes(config, { partial: true });
      const exitCode = figures.unreadable.length > 0 ? 1 : 0;
      if (out.json) out.data({ ...figures, exitCode });
      else {
        if ('writes' in figures) printLoad(out, figures);
        else printSizes(out, figures);
        for (const u of figures.unreadable) out.line(`${u.host}: UNREACHABLE: ${u.reason}`);
      }
      if (exitCode !== 0)
        out.info(
          `status: ${lib().plural(figures.unreadable.length, 'host')} could not be read; ${options.load ? 'load' : 'sizes'} of the others above`,
        );
      done(exitCode);
      return;
    }
    const result = await status(config);
    // 0 all good, 1 a host could not be read, 3 something is off.
    const exitCode = result.hosts.some((h) => !h.reachable) ? 1 : result.ok ? 0 : 3;
    if (out.json) {
      out.data({ ...result, exitCode });
    } else {
      // A move's switch is recorded host by host: switched once any of its hosts says so (as status's next: reads it).
      const switchedMoves = new Set(
        result.hosts.flatMap((h) => h.moves.filter((m) => m.switched).map((m) => m.moveId)),
      );
      for (const h of result.hosts) {
        if (!h.reachable) {
          out.line(`${h.host}: ${h.denied ? 'NOT READABLE' : 'UNREACHABLE'}: ${h.error}`);
          continue;
        }
        const levels = Object.entries(h.levels)
          .map(([level, shards]) => `${level} (${shards})`)
          .join(', ');
        out.line(
          `${h.host}: ${h.ok ? 'ok' : 'NOT OK'} — PostgreSQL ${h.serverVersion}; ${h.expected} expected, ${h.present} present, ` +
            `${h.missing.length} missing, ${h.unexpected.length} not mapped here; migration level ${levels || 'none'} of ${result.latestVersion}`,
        );
        if (h.topology) {
          const t = h.topology;
          out.line(
            `  ${t.inRecovery ? 'a STANDBY (in recovery)' : 'primary'}${t.primary ? ` at ${t.primary}` : ''}; ` +
              (t.standbys.length === 0
                ? 'no standbys streaming from it'
                : `standbys: ${t.standbys.map((s) => lib().describeStandby(s)).join('; ')}`),
          );
        }
        for (const other of h.twoPrimaries)
          out.line(
            `  TWO PRIMARIES: ${other} also answers as a writable primary of ${h.host} (its url lists it): clients that reach it first write there, apart from ${h.topology?.primary ?? 'the primary above'}; stop it, or make it a standby of the primary`,
          );
        if (h.missing.length) out.line(`  missing: ${formatShardList(h.missing)}`);
        if (h.unexpected.length) out.line(`  present but mapped to another host: ${formatShardList(h.unexpected)}`);
        if (h.fenced.length) out.line(`  fenced old copies (moved away, waiting for gc): ${formatShardList(h.fenced)}`);
        if (h.refusingWrites.length) {
          out.line(
            `  REFUSING WRITES (fenced by a move that has not switched; its unfinished move below says how to finish it): ${formatShardList(h.refusingWrites)}`,
          );
        }
        if (h.cachedSequences.length) {
          out.line(
            `  sequences with CACHE > 1 (next_id refuses them; ALTER SEQUENCE … CACHE 1): ${h.cachedSequences.join(', ')}`,
          );
        }
        for (const problem of h.sequenceProblems) out.line(`  id sequence: ${problem}`);
        if (h.incoming.length) {
          out.line(
            `  arriving by a move (running or interrupted; its unfinished move below says how to finish it): ${formatShardList(h.incoming)}`,
          );
        }
        if (h.behind.length) out.line(`  behind (pending migrations): ${formatShardList(h.behind)}`);
        if (h.handBuilt.length)
          out.line(`  built by hand, not taken over by shardctl: ${formatShardList(h.handBuilt)} (run adopt)`);
        if (h.nextIdOutdated.length)
          out.line(`  next_id missing or outdated: ${formatShardList(h.nextIdOutdated)} (run init)`);
        if (h.slowPathChangingOver)
          out.line(
            "  next_id's slow path is still changing over from its row lock (a transaction from before the upgrade was running): correct meanwhile, one more transaction id per slow-path call; the next init, migrate or move-shard finishes it",
          );
        for (const d of h.drift) out.line(`  drift: ${d}`);
        for (const m of h.moves) {
          out.line(
            `  unfinished move ${m.moveId}: shards ${m.shards} from ${m.source} to ${m.target} ` +
              (m.aborting
                ? `(its abort was cut off: move-shard ${m.shards} --abort)`
                : switchedMoves.has(m.moveId)
                  ? `(it has switched, so it can only be finished: move-shard ${m.shards} --resume)`
                  : `(move-shard ${m.shards} --resume, or --abort)`),
          );
        }
        if (h.leftovers.length) out.line(`  left by killed runs (shardctl gc drops them): ${h.leftovers.join(', ')}`);
        for (const w of h.controlWriters)
          out.line(
            `  control table ${w.table} is writable by role ${w.role}, not only by its owner: a router opened from seeds does not trust this host's registry (REVOKE its INSERT, UPDATE, DELETE, TRUNCATE and TRIGGER, on the table and its columns, or its membership of the owner)`,
          );
        for (const m of h.registryMismatches)
          out.line(
            `  registry: host ${m.name} at ${m.registry}, the file says ${m.file} (a failover, or an edited registry: check it, then run shardctl map set-address ${m.name})`,
          );
      }
    }
    if (!out.json) printMap(out, result.map, result.next);
    if (!out.json) for (const line of lib().describeRollout(result.rollout)) out.line(`rollout: ${line}`);
    out.info(
      `status: ${result.ok ? 'all hosts ok' : exitCode === 1 ? 'a host could not be read' : 'something is off'}`,
    );
    if (result.next.length > 0) out.info(nextLine(result.next, lib().formatShardList));
    done(exitCode);
  });
}

function printMap(out: Output, map: StatusResult['map'], next: StatusResult['next']): void {
  if (map.readFrom.length === 0) {
    out.line("map: the fleet's placement could not be read (no host could be read); the file was not compared");
    return;
  }
  const stale = map.disagreements.length > 0;
  // Only a fleet whose every host was read is known to have no records; adopt records it when init would refuse.
  const unrecorded =
    map.notRead.length > 0
      ? 'no fleet recorded there'
      : `no fleet recorded yet: run ${next.some((s) => s.action === 'adopt') ? 'adopt' : 'init'}`;
  const partial =
    map.notRead.length > 0 ? `; based on ${map.readFrom.join(', ')} only: ${map.notRead.join(', ')} not read` : '';
  out.line(
    `map: ${stale ? 'the file DISAGREES with the fleet' : 'the file agrees with the fleet'} (placement version ${map.placementVersion}` +
      `${map.fleetId ? `, fleet ${map.fleetId}` : `, ${unrecorded}`}${partial})`,
  );
  for (const d of map.disagreements) {
    out.line(
      `  shards ${d.shards}: the file says ${d.file ?? 'nothing'}, the fleet says ${d.fleet}${d.unknownHost ? ' (not in the file)' : ''}`,
    );
  }
  if (stale) out.line('  update the file from the fleet: shardctl map pull');
  if (map.unlistedHosts.length > 0) out.line(`  hosts of the fleet not in the file: ${map.unlistedHosts.join(', ')}`);
  for (const p of map.problems) out.line(`  PROBLEM: ${p}`);
}

/** How many of the largest shards the human output lists (--json has them all). */
const LARGEST_SHOWN = 10;

function printLoad(out: Output, load: LoadResult): void {
  const hostRows = load.hosts.map((h) => [
    h.host,
    String(h.shards),
    `${h.writes}`,
    `${h.reads}`,
    h.statsReset ? `since ${h.statsReset}` : 'since the server started (never reset)',
  ]);
  // Without the hosts that could not be read, the sum is not the fleet's: labelled so.
  const total = [
    load.unreadable.length > 0 ? 'readable' : 'total',
    String(load.shards.length),
    `${load.writes}`,
    `${load.reads}`,
    '',
  ];
  for (const line of columns([['host', 'shards', 'writes', 'reads', ''], ...hostRows, total])) out.line(line.trimEnd());
  const busiest = load.shards.slice(0, LARGEST_SHOWN);
  if (busiest.length === 0) return;
  out.line(
    `busiest shards${load.shards.length > LARGEST_SHOWN ? ` (${LARGEST_SHOWN} of ${load.shards.length}; --json lists all)` : ''}:`,
  );
  const shardRows = busiest.map((s) => [String(s.shard), s.host, `${s.writes}`, `${s.reads}`]);
  for (const line of columns([['shard', 'host', 'writes', 'reads'], ...shardRows], '  ')) out.line(line);
}

function printSizes(out: Output, sizes: SizesResult): void {
  const { formatShardList } = lib();
  const hostRows = sizes.hosts.map((h) => [
    h.host,
    String(h.shards),
    formatBytes(h.bytes),
    `${h.bytes}`,
    `~${h.rows}`,
    `${h.drain ? 'draining' : `weight ${h.weight}`}${h.missing.length > 0 ? `; missing: ${formatShardList(h.missing)}` : ''}`,
  ]);
  const total = [
    sizes.unreadable.length > 0 ? 'readable' : 'total',
    String(sizes.shards.length),
    formatBytes(sizes.bytes),
    `${sizes.bytes}`,
    `~${sizes.rows}`,
    '',
  ];
  for (const line of columns([['host', 'shards', 'size', 'bytes', 'rows', ''], ...hostRows, total]))
    out.line(line.trimEnd());
  const largest = sizes.shards.slice(0, LARGEST_SHOWN);
  if (largest.length === 0) return;
  out.line(
    `largest shards${sizes.shards.length > LARGEST_SHOWN ? ` (${LARGEST_SHOWN} of ${sizes.shards.length}; --json lists all)` : ''}:`,
  );
  const shardRows = largest.map((s) => [String(s.shard), s.host, formatBytes(s.bytes), `${s.bytes}`, `~${s.rows}`]);
  for (const line of columns([['shard', 'host', 'size', 'bytes', 'rows'], ...shardRows], '  ')) out.line(line);
}
