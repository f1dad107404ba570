/**
 * Identifiers and literals for the few places where SQL text must name an object. Identifiers are
 * validated before they get here (config and argument validation), and are still always quoted.
 */

export function quoteIdent(name: string): string {
  if (name.length === 0 || name.includes('\0')) throw new Error(`invalid identifier ${JSON.stringify(name)}`);
  return `"${name.replaceAll('"', '""')}"`;
}

export function quoteLiteral(value: string): string {
  if (value.includes('\0')) throw new Error('string literal contains a NUL byte');
  // standard_conforming_strings is on in every supported PostgreSQL; E'' is used only for backslashes.
  const escaped = value.replaceAll("'", "''");
  return value.includes('\\') ? `E'${escaped.replaceAll('\\', '\\\\')}'` : `'${escaped}'`;
}
