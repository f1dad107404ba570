/**
 * libpq's meaning of `sslmode` for every URL shardctl hands to node-postgres.
 *
 * node-postgres 8 reads `sslmode=require` (and `prefer`, `verify-ca`) as `verify-full`: a server
 * whose certificate is not in Node's store fails with "unable to verify the first certificate",
 * where psql, libpq and every other driver connect (require means encrypt, not verify). Its
 * connection-string parser has libpq's semantics behind `uselibpqcompat=true`; this adds that
 * parameter to a URL that sets `sslmode` (and does not choose already), only on the way to
 * node-postgres: the URL kept in the config, written to the registry or given to a subscription
 * (the server's own libpq) is unchanged. What follows, as in libpq:
 *
 *   disable      no TLS
 *   require      TLS, the certificate not checked (with sslrootcert: checked against it, as verify-ca)
 *   verify-ca    TLS, the certificate checked against sslrootcert (required), not the host name
 *   verify-full  TLS, the certificate and the host name checked
 *   prefer       TLS without checks; unlike libpq, no fallback to a plaintext connection
 *
 * `sslcert`/`sslkey` give a client certificate, `sslrootcert` the CA file.
 */
export function libpqCompatible(url: string): string {
  const query = url.indexOf('?');
  if (query === -1) return url;
  const params = new URLSearchParams(url.slice(query + 1));
  if (!params.has('sslmode') || params.has('uselibpqcompat')) return url;
  return `${url}&uselibpqcompat=true`;
}
