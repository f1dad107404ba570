import { describe, expect, it } from 'vitest';
import { dropIncomingGuardsSql, incomingGuardFunctionSql, incomingGuardsSql } from '../../src/moves/sql/incoming.js';

describe("an incoming copy's guard", () => {
  it('refuses a name or host that could end the DO block quoting, instead of writing it in', () => {
    expect(() => incomingGuardsSql('m1', ['insta1'], 'pg$incoming$')).toThrow('contains "$"');
    expect(() => incomingGuardsSql('m1', ['insta$1'], 'pg2')).toThrow('contains "$"');
    expect(() => dropIncomingGuardsSql('m1', ['x$incoming$'])).toThrow('contains "$"');
  });

  it('names the holder as a literal, and lets the move through by its two settings only', () => {
    const text = incomingGuardsSql('m1', ['insta1', 'insta2'], "pg'2");
    expect(text).toContain("'pg''2'");
    expect(text).toContain("ARRAY['insta1', 'insta2']");
    expect(text).toContain("'shardctl.copying', 'shardctl.building'");
    expect(text).toContain("s.state = 'incoming'");
  });

  it('is a SECURITY DEFINER function with a fixed search_path, passing writes once the shard is active', () => {
    const text = incomingGuardFunctionSql('m1');
    expect(text).toContain('SECURITY DEFINER SET search_path = pg_catalog, pg_temp');
    expect(text).toContain("state = 'active'");
    expect(text).toContain("USING ERRCODE = 'SC100'");
  });
});
