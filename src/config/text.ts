/**
 * The config's text into a plain value: YAML or JSON, with the line and column of a syntax error
 * and nothing of the text around it (which may hold a password); why a file could not be read.
 */
import { LineCounter, parseDocument } from 'yaml';

export type Parsed = { value: unknown } | { error: string };

export function parseYaml(text: string): Parsed {
  const lineCounter = new LineCounter();
  const document = parseDocument(text, { lineCounter, prettyErrors: false });
  const [first] = document.errors;
  if (first) {
    const { line, col } = lineCounter.linePos(first.pos[0]);
    return { error: `not valid YAML at line ${line}, column ${col}: ${first.message}` };
  }
  try {
    return { value: document.toJS() };
  } catch (error) {
    // e.g. an alias bomb: yaml refuses to expand more than 100 aliases
    return { error: `not valid YAML: ${(error as Error).message}` };
  }
}

export function parseJson(text: string): Parsed {
  // A byte order mark (some Windows editors write one) is no JSON token; the YAML reader skips it.
  const json = text.startsWith('\uFEFF') ? text.slice(1) : text;
  let value: unknown;
  try {
    value = JSON.parse(json);
  } catch (error) {
    const message = (error as Error).message;
    return { error: `not valid JSON${jsonErrorPosition(json, message)}: ${withoutQuotedText(message)}` };
  }
  const repeated = repeatedJsonKey(json);
  return repeated ? { error: repeated } : { value };
}

/**
 * JSON.parse keeps the last of a key given twice in one object without a word (a second `url`
 * replaces the first); YAML refuses it. JSON is YAML 1.2, so the YAML reader finds it, with where.
 */
function repeatedJsonKey(json: string): string | undefined {
  const lineCounter = new LineCounter();
  const document = parseDocument(json, { lineCounter, prettyErrors: false, uniqueKeys: true });
  const duplicate = document.errors.find((e) => e.code === 'DUPLICATE_KEY');
  if (!duplicate) return undefined;
  const { line, col } = lineCounter.linePos(duplicate.pos[0]);
  // The key only, never a value (which may hold a password).
  const key = /^"(?:[^"\\]|\\.)*"/.exec(json.slice(duplicate.pos[0]))?.[0];
  return `not valid JSON at line ${line}, column ${col}: ${key ? `key ${key}` : 'a key'} given twice in one object`;
}

/** JSON.parse reports a character offset (Node 20) or a line and column (Node 22+), or nothing. */
function jsonErrorPosition(text: string, message: string): string {
  const lineColumn = /\(line (\d+) column (\d+)\)/.exec(message);
  if (lineColumn) return ` at line ${lineColumn[1]}, column ${lineColumn[2]}`;
  const offset = /at position (\d+)/.exec(message);
  if (!offset) return '';
  const before = text.slice(0, Number(offset[1])).split('\n');
  return ` at line ${before.length}, column ${(before.at(-1) ?? '').length + 1}`;
}

/** V8 quotes the text around the error, which may hold a password; keep only what it found wrong. */
function withoutQuotedText(message: string): string {
  return message
    .replace(/,? *(?:\.\.\.)?"[\s\S]*$/, '')
    .replace(/ in JSON at position \d+[\s\S]*$/, '')
    .replace(/ \(line \d+ column \d+\)/, '');
}

export function unreadableFileMessage(configPath: string, error: unknown): string {
  const code = (error as NodeJS.ErrnoException).code;
  if (code === 'ENOENT') {
    return `config file ${configPath} does not exist (pass the path, or set SHARDCTL_CONFIG)`;
  }
  if (code === 'EISDIR') return `config file ${configPath} is a folder, not a file`;
  return `cannot read config file ${configPath}: ${(error as Error).message}`;
}
