import type { Command } from 'commander';
import type { ExecResult, ExecValue } from '../index.js';
import { lib } from './library.js';
import { type CliContext, loadCliConfig } from './context.js';
import { configOption, parseDurationOption, withFlagNames, type CommonFlags as ConfigOption } from './options.js';
import { errorJson, Output, plural, seconds, toJson } from './output.js';

interface ExecFlags extends ConfigOption {
  shards?: string;
  json?: boolean;
  csv?: boolean;
  concurrency?: string;
  write?: boolean;
  statementTimeout?: string;
}

const MAX_CONCURRENCY = 256;

export function registerExec(program: Command, ctx: CliContext, done: (code: number) => void): void {
  const command = program
    .command('exec')
    .description(
      'run one SQL statement in every shard schema (or --shards) and print the rows with a leading shard column',
    )
    .argument('<sql>', 'the SQL to run in each shard (search_path is the shard schema)')
    .option('--shards <list>', 'only these shards, e.g. 17 or 0-99,200')
    .option(
      '--json',
      'print a JSON array of rows (bigints and numerics as decimal strings); when shards fail, an object of the rows and the failures',
    )
    .option('--csv', 'print CSV with a header line')
    .option(
      '--concurrency <n>',
      "connections running at once over all hosts (default: 10 per host); read-only runs split a host's shards over its connections, up to 256 per round trip",
    )
    .option(
      '--statement-timeout <duration>',
      "each shard's statement is cancelled past this (500ms, 5s, 1min) and reported as that shard's failure; a host that stops answering is given up on sooner too",
    )
    .option(
      '--write',
      'allow writes (default: read-only: only SELECT, WITH, VALUES, TABLE, SHOW and EXPLAIN, each shard in a READ ONLY transaction; see the README)',
    );
  configOption(command);
  command.action(async (sql: string, flags: ExecFlags) => {
    const { execSql, groupFailures, parseShardList, shardsPhrase, ShardFanOutError, ShardRouter, UsageError } = lib();
    if (flags.json && flags.csv) throw new UsageError('options --json and --csv: choose one');
    if (sql.trim().length === 0) throw new UsageError('argument <sql>: empty');
    let concurrency: number | undefined;
    if (flags.concurrency !== undefined) {
      if (
        !/^\d+$/.test(flags.concurrency) ||
        Number(flags.concurrency) < 1 ||
        Number(flags.concurrency) > MAX_CONCURRENCY
      ) {
        throw new UsageError(
          `option --concurrency ${JSON.stringify(flags.concurrency)}: expected a whole number from 1 to ${MAX_CONCURRENCY}`,
        );
      }
      concurrency = Number(flags.concurrency);
    }
    const statementTimeoutMs =
      flags.statementTimeout === undefined
        ? undefined
        : parseDurationOption('--statement-timeout', flags.statementTimeout, 1, 86_400_000);
    let shards: number[] | undefined;
    if (flags.shards !== undefined) {
      const parsed = parseShardList(flags.shards);
      if ('error' in parsed) throw new UsageError(`option --shards: ${parsed.error}`);
      shards = parsed.shards;
    }
    const out = new Output(ctx.streams, flags.json ?? false);
    const config = await loadCliConfig(ctx, flags, out, { checkMigrationsDir: false });
    const outside = shards?.filter((s) => s >= config.shards) ?? [];
    if (outside.length > 0) {
      throw new UsageError(
        `option --shards ${JSON.stringify(flags.shards)}: shard ${outside[0]} is not in the map (0-${config.shards - 1})`,
      );
    }

    const router = await ShardRouter.openConfig(config, {
      env: ctx.streams.env,
      cwd: ctx.cwd,
      applicationName: 'shardctl exec',
      ...(concurrency ? { poolSize: Math.min(concurrency, 10) } : {}),
      ...(statementTimeoutMs ? { statementTimeoutMs } : {}),
    });
    const progress = execProgress(out);
    const started = performance.now();
    let result: ExecResult;
    try {
      result = await withFlagNames({ sql: 'argument <sql>' }, () =>
        execSql(router, sql, {
          write: flags.write ?? false,
          ...(shards ? { shards } : {}),
          ...(concurrency ? { concurrency } : {}),
          onShardDone: (event) => progress.update(event),
        }),
      );
    } finally {
      progress.stop();
      await router.close();
    }

    // Under --json the failures are on stdout too: a script reads the rows and which shards failed
    // (with each one's host, SQLSTATE and message) from one document, an object when shards failed.
    if (flags.json)
      out.data(
        result.failures.length === 0
          ? jsonRows(result)
          : {
              rows: jsonRows(result),
              error: errorJson(new ShardFanOutError([], result.failures, result.shards)),
            },
      );
    // Rows are output like every message: a password among the values is masked (JSON's out.data does the same).
    else if (flags.csv) ctx.streams.stdout.write(lib().redact(csv(result)));
    else if (result.columns.length > 0) ctx.streams.stdout.write(lib().redact(table(result)));
    const summary = `exec: ${plural(result.shards, 'shard')}, ${plural(result.rows.length, 'row')}, ${result.failures.length} failed, ${seconds(performance.now() - started)}`;
    if (result.failures.length === 0) {
      out.info(summary);
      done(0);
      return;
    }
    const failed = result.failures.map((f) => f.shard);
    out.info(
      `${out.paint('31', 'error:')} ${result.failures.length} of ${result.shards} shards failed: ${shardsPhrase(failed)}`,
    );
    for (const group of groupFailures(result.failures)) out.info(`  ${group.line}`);
    if (!flags.write && result.failures.some((f) => (f.error as { code?: string }).code === '25006')) {
      out.info('  the statement writes: exec runs read-only transactions unless --write is given');
    }
    out.info(summary);
    done(1);
  });
}

/** Progress on stderr: bars per host on a terminal; elsewhere a line at each quarter once a run takes over a second. */
function execProgress(out: Output): {
  update(event: { host: string; ok: boolean; done: number; total: number }): void;
  stop(): void;
} {
  const bars = out.progress();
  const perHost = new Map<string, { done: number; failed: number }>();
  const started = performance.now();
  let quarter = 0;
  const tty = Boolean(out.streams.stderr.isTTY);
  return {
    update(event) {
      const h = perHost.get(event.host) ?? { done: 0, failed: 0 };
      h.done += 1;
      if (!event.ok) h.failed += 1;
      perHost.set(event.host, h);
      if (tty) {
        bars.update({ host: event.host, done: h.done, total: event.total, failed: h.failed });
        return;
      }
      const reached = Math.floor((event.done * 4) / event.total);
      if (reached > quarter) {
        quarter = reached;
        if (performance.now() - started > 1000 && event.done < event.total)
          out.info(`exec: ${event.done}/${event.total} shards done`);
      }
    },
    stop: () => bars.stop(),
  };
}

function jsonRows(result: ExecResult): Record<string, ExecValue>[] {
  return result.rows.map((row) => {
    const object: Record<string, ExecValue> = { shard: row.shard };
    result.columns.forEach((column, i) => {
      object[column] = row.values[i] ?? null;
    });
    return object;
  });
}

function text(value: ExecValue | undefined): string {
  if (value === null || value === undefined) return '';
  if (typeof value === 'object') return toJson(value).replace(/\s*\n\s*/g, ' ');
  if (typeof value === 'boolean') return value ? 't' : 'f';
  return String(value);
}

function csv(result: ExecResult): string {
  const cell = (s: string) => (/[",\r\n]/.test(s) || s !== s.trim() ? `"${s.replaceAll('"', '""')}"` : s);
  const lines = [['shard', ...result.columns].map(cell).join(',')];
  for (const row of result.rows) lines.push([String(row.shard), ...row.values.map((v) => cell(text(v)))].join(','));
  return `${lines.join('\n')}\n`;
}

/** Aligned columns as psql prints them: numbers to the right. */
function table(result: ExecResult): string {
  const header = ['shard', ...result.columns];
  const cells = result.rows.map((row) => [String(row.shard), ...row.values.map(text)]);
  const numeric = header.map(
    (_, i) =>
      i === 0 ||
      result.rows.every(
        (row) =>
          typeof row.values[i - 1] === 'number' ||
          row.values[i - 1] === null ||
          /^-?\d+(\.\d+)?$/.test(text(row.values[i - 1])),
      ),
  );
  const widths = header.map((h, i) => Math.max(h.length, ...cells.map((row) => row[i]!.length)));
  const line = (row: string[]) =>
    row
      .map((c, i) => (numeric[i] ? c.padStart(widths[i]!) : c.padEnd(widths[i]!)))
      .join(' | ')
      .trimEnd();
  return `${[
    header
      .map((h, i) => h.padEnd(widths[i]!))
      .join(' | ')
      .trimEnd(),
    widths.map((w) => '-'.repeat(w)).join('-+-'),
    ...cells.map(line),
  ].join('\n')}\n(${plural(result.rows.length, 'row')})\n`;
}
