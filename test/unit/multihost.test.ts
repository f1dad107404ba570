import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config/load.js';
import { UsageError } from '../../src/errors.js';
import { hostAddress } from '../../src/fleet/placement.js';
import {
  attrsFor,
  connectFirstMatching,
  formatPostgresUrl,
  parsePostgresUrl,
  sessionMatches,
  singleAddressUrls,
  type SessionState,
  withCredentials,
} from '../../src/pg/multihost.js';
import { redact, redactUrl, registerUrlSecret } from '../../src/pg/redact.js';

const PRIMARY: SessionState = { inRecovery: false, readOnly: false };
const STANDBY: SessionState = { inRecovery: true, readOnly: true };
const READ_ONLY_PRIMARY: SessionState = { inRecovery: false, readOnly: true };

describe('multi-host URLs (libpq syntax)', () => {
  it('splits a URL of several addresses into one URL per address, keeping user, database and parameters', () => {
    const url = parsePostgresUrl(
      'postgres://app:s3cr3t@db2a:5432,db2b:5433,[::1]:5434/app?sslmode=require&target_session_attrs=primary',
    );
    expect(url.addresses).toEqual([
      { host: 'db2a', port: '5432' },
      { host: 'db2b', port: '5433' },
      { host: '[::1]', port: '5434' },
    ]);
    expect(url.targetSessionAttrs).toBe('primary');
    expect(singleAddressUrls(url)).toEqual([
      'postgres://app:s3cr3t@db2a:5432/app?sslmode=require',
      'postgres://app:s3cr3t@db2b:5433/app?sslmode=require',
      'postgres://app:s3cr3t@[::1]:5434/app?sslmode=require',
    ]);
  });

  it('defaults to read-write for several addresses and to no check for one', () => {
    expect(attrsFor(parsePostgresUrl('postgres://a@h1,h2/db'))).toBe('read-write');
    expect(attrsFor(parsePostgresUrl('postgres://a@h1/db'))).toBe('any');
    expect(attrsFor(parsePostgresUrl('postgres://a@h1/db?target_session_attrs=read-write'))).toBe('read-write');
  });

  it.each([
    ['postgres://a@h1,,h2/db', 'address 2 of 3 is empty'],
    ['postgres://a@h1:5432,h2:99999/db', 'port "99999" is not a number from 1 to 65535'],
    ['postgres://a@h1:0/db', 'port "0" is not a number from 1 to 65535'],
    [
      'postgres://a@h1,h2/db?target_session_attrs=master',
      'target_session_attrs="master": must be one of any, read-write',
    ],
    [
      'postgres://a@h1/db?target_session_attrs=any&target_session_attrs=primary',
      'gives target_session_attrs more than once',
    ],
    ['mysql://a@h1,h2/db', 'is not a postgres:// or postgresql:// URL'],
  ])('refuses %s, naming the field and the value', (url, reason) => {
    let error: unknown;
    try {
      parsePostgresUrl(url, 'hosts[1].url');
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(UsageError);
    expect((error as UsageError).message).toContain('hosts[1].url');
    expect((error as UsageError).message).toContain(reason);
    expect((error as UsageError).exitCode).toBe(2);
  });

  it('never shows the password of a URL it refuses', () => {
    expect(() => parsePostgresUrl('postgres://app:hunter2hunter@h1,,h2/db')).toThrow(/postgres:\/\/app:\*\*\*@h1,,h2/);
    expect(() => parsePostgresUrl('postgres://app:hunter2hunter@h1,,h2/db')).not.toThrow(/hunter2/);
  });

  it('shows no part of a password that ends the user information early (an unencoded # / ? @), with or without a scheme (property)', () => {
    const word = fc.stringMatching(/^[A-Za-z0-9]{6,12}$/);
    fc.assert(
      fc.property(
        word,
        fc.constantFrom('#', '/', '?', '@', '#/'),
        word,
        fc.boolean(),
        (head, special, tail, scheme) => {
          const url = `${scheme ? 'postgres://' : ''}app:${head}${special}${tail}@h1:5432/db`;
          let shown = '';
          try {
            parsePostgresUrl(url, 'seeds[0]');
          } catch (error) {
            shown = `${(error as Error).message} ${JSON.stringify(error)}`;
          }
          expect(shown).not.toContain(head);
          expect(shown).not.toContain(tail);
        },
      ),
    );
    expect(redactUrl('app:AppPw#secret@127.0.0.1')).toBe('app:***@127.0.0.1');
  });

  it('refuses a URL with whitespace (a space in a password, unencoded), showing none of it; a URL registered before that check is masked', () => {
    for (const url of [
      'postgres://spacey:Sp ace!Pw9@127.0.0.1:32887/postgres',
      'postgres://spacey:Sp\tace!Pw9@h1,h2/db',
      'postgres://spacey:pw@127.0.0.1:32887/post gres',
    ]) {
      let error: unknown;
      try {
        parsePostgresUrl(url, 'hosts[1].url');
      } catch (e) {
        error = e;
      }
      const shown = `${(error as Error).message} ${JSON.stringify(error)}`;
      expect(shown).toContain(
        'hosts[1].url: is not a valid URL (it holds whitespace; in a password write a space as %20)',
      );
      expect(shown).not.toMatch(/ace!Pw9|Sp.ace|spacey/);
    }
    // Around the URL (a newline an environment variable ends with), whitespace is ignored as before.
    expect(parsePostgresUrl('postgres://app:pw@h1:5432/db\n').addresses).toEqual([{ host: 'h1', port: '5432' }]);
    registerUrlSecret('postgres://spacey:Sp ace!Pw9@127.0.0.1:32887/postgres');
    expect(redact('connected with Sp ace!Pw9 as the password')).toBe('connected with *** as the password');
  });

  it('refuses a password cut short whose head would pass for a port or a host, showing none of it', () => {
    // Once found by the property above: the head read as the port "100000" and was shown.
    for (const url of [
      'postgres://app:100000#0A0a00@h1:5432/db',
      'postgres://app:12345#tail9@h1:5432/db', // a head that is a valid port: accepted before
      'postgres://app:hostx?tail9@h1:5432/db',
      'postgres://app:hostx/tail9@h1:5432/db',
    ]) {
      let error: unknown;
      try {
        parsePostgresUrl(url, 'hosts[0].url');
      } catch (e) {
        error = e;
      }
      expect(error, url).toBeInstanceOf(UsageError);
      const shown = `${(error as Error).message} ${JSON.stringify(error)}`;
      expect(shown).toMatch(/hosts\[0\]\.url.*must be percent-encoded/);
      for (const part of ['100000', '12345', 'hostx', 'tail9', '0A0a00']) expect(shown).not.toContain(part);
    }
    expect(parsePostgresUrl('postgres://app:p%23w@h1:5432/db').addresses).toEqual([{ host: 'h1', port: '5432' }]);
  });

  it('refuses a port parameter that is not a port and an sslmode libpq does not know, naming the field', () => {
    for (const port of ['abc', '70000', '0', '5432,x', ''])
      expect(() => parsePostgresUrl(`postgres://u:secret@h1/db?port=${port}`, 'hosts[0].url')).toThrow(
        /port=.*each port must be a number from 1 to 65535/,
      );
    expect(parsePostgresUrl('postgres://u:secret@h1,h2/db?port=5432,5433').addresses).toHaveLength(2);
    expect(() => parsePostgresUrl('postgres://u:secret@h1/db?sslmode=bogus', 'seeds[0]')).toThrow(
      /sslmode="bogus": must be one of disable, allow, prefer, require, verify-ca, verify-full, no-verify/,
    );
    expect(parsePostgresUrl('postgres://u:secret@h1/db?sslmode=verify-full').addresses).toHaveLength(1);
  });

  it('redacts the password of a multi-host URL wherever it appears', () => {
    registerUrlSecret('postgres://app:pw-9f8e7d@h1:5432,h2:5433/db');
    expect(redactUrl('postgres://app:pw-9f8e7d@h1:5432,h2:5433/db')).toBe('postgres://app:***@h1:5432,h2:5433/db');
    expect(redact('failed: postgres://app:pw-9f8e7d@h1:5432,h2:5433/db and pw-9f8e7d')).not.toContain('pw-9f8e7d');
  });

  it('round-trips any list of addresses and parameters (property)', () => {
    const hostName = fc.stringMatching(/^[a-z][a-z0-9-]{0,10}$/);
    const port = fc.option(fc.integer({ min: 1, max: 65535 }).map(String), { nil: undefined });
    fc.assert(
      fc.property(
        fc.array(fc.record({ host: hostName, port }), { minLength: 1, maxLength: 5 }),
        fc.constantFrom(undefined, 'any', 'read-write', 'read-only', 'primary', 'standby', 'prefer-standby'),
        fc.boolean(),
        (addresses, attrs, tls) => {
          const hosts = addresses.map((a) => `${a.host}${a.port ? `:${a.port}` : ''}`).join(',');
          const params = [...(tls ? ['sslmode=require'] : []), ...(attrs ? [`target_session_attrs=${attrs}`] : [])];
          const text = `postgres://u:p@${hosts}/db${params.length ? `?${params.join('&')}` : ''}`;
          const parsed = parsePostgresUrl(text);
          expect(parsed.addresses).toEqual(addresses);
          expect(parsed.targetSessionAttrs).toBe(attrs);
          expect(formatPostgresUrl(parsed)).toBe(text);
          for (const single of singleAddressUrls(parsed)) {
            expect(single).not.toContain(',');
            expect(single).not.toContain('target_session_attrs');
            expect(new URL(single).username).toBe('u');
          }
        },
      ),
    );
  });

  it.each([
    ['any', READ_ONLY_PRIMARY, true],
    ['read-write', PRIMARY, true],
    ['read-write', STANDBY, false],
    ['read-write', READ_ONLY_PRIMARY, false],
    ['read-only', STANDBY, true],
    ['primary', READ_ONLY_PRIMARY, true],
    ['primary', STANDBY, false],
    ['standby', STANDBY, true],
    ['standby', PRIMARY, false],
  ] as const)('target_session_attrs=%s takes %o: %s', (attrs, state, expected) => {
    expect(sessionMatches(attrs, state, 'last')).toBe(expected);
  });

  it('takes the first address that matches, in order, and lists every address when none does', async () => {
    const states = [STANDBY, PRIMARY, PRIMARY];
    const url = parsePostgresUrl('postgres://a@h1:1,h2:2,h3:3/db');
    const steps = {
      open: (_single: string, i: number) =>
        i === 0 || i === 1 ? Promise.resolve(i) : Promise.reject(new Error('refused')),
      stateOf: (i: number) => Promise.resolve(states[i]!),
      close: () => Promise.resolve(),
      describe: (e: unknown) => (e as Error).message,
    };
    expect((await connectFirstMatching(url, 'read-write', steps)).index).toBe(1);
    expect((await connectFirstMatching(url, 'prefer-standby', steps)).index).toBe(0);
    await expect(
      connectFirstMatching(url, 'standby', { ...steps, open: (_s, i) => steps.open(_s, i + 1) }),
    ).rejects.toThrow(
      'no address is standby: h1:1 is a primary, not standby; h2:2 cannot connect: refused; h3:3 cannot connect: refused',
    );
  });

  it('keeps a multi-host URL in the registry without credentials, and adds a seed’s to it', () => {
    expect(hostAddress('postgres://app:pw@h1:5432,h2:5433/db?sslmode=require&target_session_attrs=primary')).toBe(
      'postgres://h1:5432,h2:5433/db?sslmode=require&target_session_attrs=primary',
    );
    expect(withCredentials('postgres://h1:5432,h2:5433/db', 'postgres://app:pw@seed/db?sslmode=verify-full')).toBe(
      'postgres://app:pw@h1:5432,h2:5433/db?sslmode=verify-full',
    );
  });

  it('accepts a multi-host URL in the config and reports a bad one under its field', () => {
    const yaml = (url: string) => `shards: 4\nhosts:\n  - name: h1\n    url: ${url}\n    shards: "0-3"\n`;
    const options = { file: 'shardctl.yaml', env: {}, now: new Date('2026-01-01T00:00:00Z') };
    const good = parseConfig(yaml('postgres://app@db1a:5432,db1b:5432/app'), options);
    expect(good.hosts[0]!.url).toBe('postgres://app@db1a:5432,db1b:5432/app');
    expect(() => parseConfig(yaml('postgres://app:pw@db1a,db1b:70000/app'), options)).toThrow(
      /hosts\[0\]\.url.*port "70000"/s,
    );
  });
});
