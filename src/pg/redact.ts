/**
 * Every message that leaves shardctl passes through redact(): connection strings lose their
 * password (in the user info, or as a `password` / `sslpassword` keyword, its name percent-encoded
 * or not), and any distinctive password we know of is masked even when it appears on its own,
 * e.g. inside an error passed up from pg. Known passwords are those of the config's URLs
 * (registered by connectHost) and PGPASSWORD (registered by the CLI's main() and by connectHost).
 *
 * A password that is not distinctive (shorter than 8 characters, or a word of letters shorter than
 * 16: `postgres`, `shard`) is hidden only where it stands as a password. Masked everywhere, it
 * would rewrite ordinary words of the output (a column named `shard`, the scheme of every
 * `postgres://` URL) and tell the reader what it is by where the `***` fall.
 */

const knownSecrets = new Set<string>();

/** Whether a password is unlike ordinary text enough to be masked wherever it appears. */
function distinctive(secret: string): boolean {
  return secret.length >= 16 || (secret.length >= 8 && !/^[\p{L}]+$/u.test(secret));
}

/**
 * Registers secrets to mask wherever they appear (distinctive ones only: see above), as they are
 * and as a message quotes them with JSON.stringify (quotes and backslashes escaped).
 */
export function registerSecret(secret: string | undefined | null): void {
  if (!secret || !distinctive(secret)) return;
  knownSecrets.add(secret);
  knownSecrets.add(JSON.stringify(secret).slice(1, -1));
}

/** Connection parameters whose value is a secret, as libpq names them. */
const PASSWORD_KEYS = new Set(['password', 'sslpassword']);

function decoded(text: string): string {
  try {
    return decodeURIComponent(text);
  } catch {
    return text;
  }
}

/** A secret and its percent-decoded form. */
function registerBoth(secret: string): void {
  registerSecret(secret);
  registerSecret(decoded(secret));
}

/** Registers the passwords of a connection string: of its user info and of its query's keywords. */
export function registerUrlSecret(url: string): void {
  // Up to the last '@': a password may hold an unencoded '@' (pg and WHATWG URL parsing take the
  // last one as the end of the user info).
  // Whitespace included: the string is the URL alone, so the password runs to that '@'
  // (parsePostgresUrl refuses such a URL, but a caller may register before it checks).
  const match = /^[a-z][a-z0-9+.-]*:\/\/[^:/@\s]*:(.*)@/is.exec(url);
  if (match?.[1]) registerBoth(match[1]);
  const query = url.indexOf('?');
  if (query < 0) return;
  for (const pair of url.slice(query + 1).split(/[&#]/)) {
    const at = pair.indexOf('=');
    if (at > 0 && PASSWORD_KEYS.has(decoded(pair.slice(0, at)).toLowerCase())) registerBoth(pair.slice(at + 1));
  }
}

// Greedy to the last '@' before a space, for the same reason: hiding part of a host is better than
// showing part of a password.
const URL_PASSWORD = /([a-z][a-z0-9+.-]*:\/\/[^:/@\s]*:)(\S*)@/gi;
const KEYWORD_PASSWORD = /(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s]+)/gi;
/** A query keyword (its name percent-encoded or not) and its value, up to the next `&`, space or quote. */
const QUERY_KEYWORD = /((?:^|[?&\s])((?:[A-Za-z0-9_.~-]|%[0-9A-Fa-f]{2})+)=)([^&\s'"]*)/g;

/** `password=` and `sslpassword=` of a query, however the name is spelled (pass%77ord=), hidden. */
function hideQueryPasswords(text: string): string {
  return text.replace(QUERY_KEYWORD, (all: string, head: string, name: string) =>
    PASSWORD_KEYS.has(decoded(name).toLowerCase()) ? `${head}***` : all,
  );
}

export function redact(text: string): string {
  let out = hideQueryPasswords(text.replace(URL_PASSWORD, '$1***@').replace(KEYWORD_PASSWORD, '$1***'));
  for (const secret of knownSecrets) {
    if (out.includes(secret)) out = out.split(secret).join('***');
  }
  return out;
}

/**
 * A value to print as JSON with every string in it passed through redact(), keys included (what
 * JSON.stringify makes of it is then redacted too: a password is masked before it is escaped, and
 * the document stays valid JSON whatever the password holds). Bigints become decimal strings.
 */
export function redactedJson(value: unknown, indent?: number): string {
  return JSON.stringify(
    value,
    function (this: unknown, _key: string, v: unknown) {
      if (typeof v === 'bigint') return v.toString();
      if (typeof v === 'string') return redact(v);
      if (v !== null && typeof v === 'object' && !Array.isArray(v)) {
        const entries = Object.entries(v as Record<string, unknown>);
        if (entries.some(([k]) => redact(k) !== k)) return Object.fromEntries(entries.map(([k, x]) => [redact(k), x]));
      }
      return v;
    },
    indent,
  );
}

/**
 * Hides the password of a connection string: `postgres://user:***@host/db`, and `password=***` in
 * a query or a key=value string. Works on malformed URLs too, since those are the ones that end up
 * quoted in error messages; it would rather hide too much than too little.
 */
export function redactUrl(url: string): string {
  return hideQueryPasswords(
    url
      .replace(/^([A-Za-z][A-Za-z0-9+.-]*:\/\/[^:@/?#]*:)[\s\S]*@/, '$1***@')
      // Without a scheme (user:password@host, as mistyped), all the same.
      .replace(/^([^:@/?#\s]*:)(?!\/\/)[\s\S]*@/, '$1***@'),
  );
}
