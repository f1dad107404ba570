/**
 * Every message that leaves shardctl passes through redact(): connection strings lose their
 * password, and any password we know of is masked even when it appears on its own, e.g. inside an
 * error passed up from pg. Known passwords are those of the config's URLs (registered by
 * connectHost) and PGPASSWORD (registered by the CLI's main() and by connectHost).
 */

const knownSecrets = new Set<string>();

/** Registers secrets to mask wherever they appear. Short strings are ignored (too many false hits). */
export function registerSecret(secret: string | undefined | null): void {
  if (secret && secret.length >= 4) knownSecrets.add(secret);
}

/** Registers the password of a connection string, if it has one. */
export function registerUrlSecret(url: string): void {
  // Up to the last '@': a password may hold an unencoded '@' (pg and WHATWG URL parsing take the
  // last one as the end of the user info).
  const match = /^[a-z][a-z0-9+.-]*:\/\/[^:/@\s]*:(\S*)@/i.exec(url);
  if (match?.[1]) {
    registerSecret(match[1]);
    try {
      registerSecret(decodeURIComponent(match[1]));
    } catch {
      // not percent-encoded: the raw form is registered already
    }
  }
}

// Greedy to the last '@' before a space, for the same reason: hiding part of a host is better than
// showing part of a password.
const URL_PASSWORD = /([a-z][a-z0-9+.-]*:\/\/[^:/@\s]*:)(\S*)@/gi;
const KEYWORD_PASSWORD = /(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s]+)/gi;

export function redact(text: string): string {
  let out = text.replace(URL_PASSWORD, '$1***@').replace(KEYWORD_PASSWORD, '$1***');
  for (const secret of knownSecrets) {
    if (out.includes(secret)) out = out.split(secret).join('***');
  }
  return out;
}

/**
 * Hides the password of a connection string: `postgres://user:***@host/db`, and `password=***` in
 * a query or a key=value string. Works on malformed URLs too, since those are the ones that end up
 * quoted in error messages; it would rather hide too much than too little.
 */
export function redactUrl(url: string): string {
  return (
    url
      .replace(/^([A-Za-z][A-Za-z0-9+.-]*:\/\/[^:@/?#]*:)[\s\S]*@/, '$1***@')
      // Without a scheme (user:password@host, as mistyped), all the same.
      .replace(/^([^:@/?#\s]*:)(?!\/\/)[\s\S]*@/, '$1***@')
      .replace(/((?:^|[?&\s])(?:ssl)?password=)[^&\s]*/gi, '$1***')
  );
}
