import { describe, expect, it } from 'vitest';
import { versionNum } from '../../src/fleet/session.js';

describe('server_version_num from the server_version reported at start-up', () => {
  it.each([
    ['18.4', 180004],
    ['15.18 (Debian 15.18-0+deb12u1)', 150018],
    ['18beta1', 180000],
    ['19devel', 190000],
    ['17rc1', 170000],
    ['10.23', 100023],
    ['9.6.24', 90624],
  ])('reads %s as %i', (version, num) => {
    expect(versionNum(version)).toBe(num);
  });

  it('gives null for a form it does not know, so the server is asked instead', () => {
    expect(versionNum('EnterpriseDB 15.2')).toBeNull();
    expect(versionNum('')).toBeNull();
  });
});
