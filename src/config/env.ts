/**
 * `${NAME}` expansion for connection strings, so passwords can stay out of the config file.
 */

export type Env = Readonly<Record<string, string | undefined>>;

export type ExpandResult = { value: string } | { error: string };

const VARIABLE_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

/**
 * Replaces every `${NAME}` with env[NAME]. A `$` not followed by `{` stays as it is. Refuses
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
    const name = rest.slice(start + 2, end);
    if (!VARIABLE_NAME.test(name)) {
      return { error: `"\${${name}}" is not a valid variable reference (names are letters, digits and _)` };
    }
    const replacement = env[name];
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
