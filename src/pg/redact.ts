/**
 * Every message that leaves shardctl passes through redact(): connection strings lose their
 * password, and any password we know of (from the config's URLs or PGPASSWORD) is masked even
 * when it appears on its own, e.g. inside an error passed up from pg.
 */

const knownSecrets = new Set<string>();

/** Registers secrets to mask wherever they appear. Short strings are ignored (too many false hits). */
export function registerSecret(secret: string | undefined | null): void {
  if (secret && secret.length >= 4) knownSecrets.add(secret);
}

/** Registers the password of a connection string, if it has one. */
export function registerUrlSecret(url: string): void {
  const match = /^[a-z][a-z0-9+.-]*:\/\/[^:/@\s]*:([^@\s]*)@/i.exec(url);
  if (match?.[1]) {
    registerSecret(match[1]);
    try {
      registerSecret(decodeURIComponent(match[1]));
    } catch {
      // not percent-encoded: the raw form is registered already
    }
  }
}

const URL_PASSWORD = /([a-z][a-z0-9+.-]*:\/\/[^:/@\s]*:)([^@\s]*)@/gi;
const KEYWORD_PASSWORD = /(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s]+)/gi;

export function redact(text: string): string {
  let out = text.replace(URL_PASSWORD, '$1***@').replace(KEYWORD_PASSWORD, '$1***');
  for (const secret of knownSecrets) {
    if (out.includes(secret)) out = out.split(secret).join('***');
  }
  return out;
}

/** The URL with its password replaced by ***, for showing which host is meant. */
export { redactUrl } from '../config/env.js';
