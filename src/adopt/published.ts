import type { IdLayout } from '../id/layout.js';

/**
 * Recognising Instagram's published id function, the one teams built by hand from the article:
 *
 *   CREATE OR REPLACE FUNCTION insta5.next_id(OUT result bigint) AS $$
 *   DECLARE
 *       our_epoch bigint := 1314220021721;
 *       seq_id bigint;
 *       now_millis bigint;
 *       shard_id int := 5;
 *   BEGIN
 *       SELECT nextval('insta5.table_id_seq') % 1024 INTO seq_id;
 *       SELECT FLOOR(EXTRACT(EPOCH FROM clock_timestamp()) * 1000) INTO now_millis;
 *       result := (now_millis - our_epoch) << 23;
 *       result := result | (shard_id << 10);
 *       result := result | (seq_id);
 *   END;
 *   $$ LANGUAGE PLPGSQL;
 *
 * Only that body is recognised (case, whitespace and comments aside; the constants read from it):
 * adopting means replacing the function under live inserts, and that is safe only for a function
 * whose ids are known to be (clock ms << timeShift) | (shard << shardShift) | (nextval % modulus).
 * Anything else is refused rather than guessed at.
 */

export interface PublishedFunction {
  readonly epochMs: bigint;
  readonly shard: number;
  /** The sequence as written in the nextval() literal, e.g. `insta5.table_id_seq`. */
  readonly sequenceText: string;
  /** The schema and name of that sequence; schema null when the literal is not schema-qualified. */
  readonly sequence: { readonly schema: string | null; readonly name: string } | null;
  readonly modulus: bigint;
  readonly timeShift: number;
  readonly shardShift: number;
}

const PUBLISHED_BODY = new RegExp(
  [
    '^declareour_epochbigint:=(\\d+);seq_idbigint;now_millisbigint;shard_id(?:int|integer|bigint):=(\\d+);',
    "beginselectnextval\\('([^']+)'(?:::regclass)?\\)%(\\d+)intoseq_id;",
    'selectfloor\\(extract\\(epochfrom(?:clock_timestamp\\(\\)|now\\(\\))\\)\\*1000\\)intonow_millis;',
    'result:=\\(now_millis-our_epoch\\)<<(\\d+);',
    'result:=result\\|\\(shard_id<<(\\d+)\\);',
    'result:=result\\|(?:\\(seq_id\\)|seq_id);',
    'end;?$',
  ].join(''),
);

/** The body without comments, whitespace and case: the form the published text is matched in. */
function normalise(source: string): string {
  return source
    .replace(/--[^\n]*/g, '')
    .replace(/\/\*[\s\S]*?\*\//g, '')
    .replace(/\s+/g, '')
    .toLowerCase();
}

/** The constants of a published next_id() body, or null when the body is anything else. */
export function parsePublishedFunction(source: string): PublishedFunction | null {
  const match = PUBLISHED_BODY.exec(normalise(source));
  if (!match) return null;
  const [, epoch, shard, sequenceText, modulus, timeShift, shardShift] = match as unknown as [
    string,
    string,
    string,
    string,
    string,
    string,
    string,
  ];
  return {
    epochMs: BigInt(epoch),
    shard: Number(shard),
    sequenceText,
    sequence: parseSequenceName(sequenceText),
    modulus: BigInt(modulus),
    timeShift: Number(timeShift),
    shardShift: Number(shardShift),
  };
}

/** `schema.name` or `name` (lower-case, unquoted: the only forms the published text uses). */
function parseSequenceName(text: string): { schema: string | null; name: string } | null {
  const match = /^(?:([a-z_][a-z0-9_$]*)\.)?([a-z_][a-z0-9_$]*)$/.exec(text);
  if (!match) return null;
  return { schema: match[1] ?? null, name: match[2]! };
}

/**
 * Where the function's constants disagree with the config's layout and the schema's shard number;
 * empty when they agree. Each entry names the constant, its value and the config's.
 */
export function publishedLayoutProblems(
  fn: PublishedFunction,
  layout: IdLayout,
  shard: number,
  schema: string,
): string[] {
  const problems: string[] = [];
  if (fn.epochMs !== layout.epochMs) {
    problems.push(
      `its epoch is ${fn.epochMs} ms (${isoOf(fn.epochMs)}), the config's idLayout.epoch is ${layout.epochMs} ms (${isoOf(layout.epochMs)})`,
    );
  }
  if (fn.modulus !== 1n << BigInt(layout.sequenceBits) || fn.shardShift !== layout.sequenceBits) {
    problems.push(
      `it keeps nextval() % ${fn.modulus} and shifts the shard by ${fn.shardShift}; the config's idLayout.sequenceBits ${layout.sequenceBits} means % ${1n << BigInt(layout.sequenceBits)} and << ${layout.sequenceBits}`,
    );
  }
  if (fn.timeShift !== layout.sequenceBits + layout.shardBits) {
    problems.push(
      `it shifts the time by ${fn.timeShift}; the config's idLayout (shardBits ${layout.shardBits} + sequenceBits ${layout.sequenceBits}) means << ${layout.shardBits + layout.sequenceBits}`,
    );
  }
  if (fn.shard !== shard) problems.push(`its shard_id is ${fn.shard}, but the schema ${schema} is shard ${shard}`);
  if (!fn.sequence) problems.push(`it draws from ${JSON.stringify(fn.sequenceText)}, not a plain schema.sequence name`);
  else if (fn.sequence.schema !== schema) {
    problems.push(
      fn.sequence.schema === null
        ? `it draws from ${fn.sequenceText} without a schema, which depends on each caller's search_path`
        : `it draws from ${fn.sequenceText}, a sequence outside its schema ${schema}`,
    );
  }
  return problems;
}

function isoOf(unixMs: bigint): string {
  const date = new Date(Number(unixMs));
  return Number.isNaN(date.getTime()) ? `${unixMs} ms` : date.toISOString();
}
