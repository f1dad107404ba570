/**
 * `${NAME}` and `${NAME:-default}` expansion for connection strings, so passwords can stay out of
 * the config file. The default form is the shell's (and docker compose's): the default applies
 * when NAME is unset or empty.
 */

export type Env = Readonly<Record<string, string | undefined>>;

export type ExpandResult = { value: string } | { error: string };

const VARIABLE_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

/**
 * Replaces every `${NAME}` with env[NAME], and `${NAME:-default}` with env[NAME] unless it is unset
 * or empty, else the default (taken as written: no expansion inside it, no `}` in it). A `$` not
 * followed by `{` stays as it is. Refuses
 * malformed references rather than passing them on, because a typo like `${PG2-URL}` would
 * otherwise reach the server as a baffling connection string.
 */
export function expandEnv(text: string, env: Env): ExpandResult {
  const missing: string[] = [];
  let value = '';
  let rest = text;
  for (let start = rest.indexOf('${'); start !== -1; start = rest.indexOf('${')) {
    const end = rest.indexOf('}', start);
    if (end === -1) return { error: `unterminated "\${" (expected \${NAME})` };
    const reference = rest.slice(start + 2, end);
    const withDefault = reference.indexOf(':-');
    const name = withDefault === -1 ? reference : reference.slice(0, withDefault);
    if (!VARIABLE_NAME.test(name)) {
      return { error: `"\${${reference}}" is not a valid variable reference (names are letters, digits and _)` };
    }
    const set = env[name];
    const replacement =
      withDefault === -1 ? set : set === undefined || set === '' ? reference.slice(withDefault + 2) : set;
    if (replacement === undefined) missing.push(name);
    value += rest.slice(0, start) + (replacement ?? '');
    rest = rest.slice(end + 1);
  }
  if (missing.length > 0) {
    const names = [...new Set(missing)];
    return names.length === 1
      ? { error: `environment variable ${names[0]} is not set` }
      : { error: `environment variables ${names.join(', ')} are not set` };
  }
  return { value: value + rest };
}
