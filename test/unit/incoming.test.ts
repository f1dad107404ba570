import { describe, expect, it } from 'vitest';
import { dropIncomingGuardsSql, incomingGuardFunctionSql, incomingGuardsSql } from '../../src/moves/sql/incoming.js';

describe("an incoming copy's guard", () => {
  it('refuses a schema name that could end the DO block quoting of the clean-up, instead of writing it in', () => {
    expect(() => dropIncomingGuardsSql(['x$incoming$'])).toThrow('contains "$"');
    expect(dropIncomingGuardsSql(['insta1'])).toContain("ARRAY['insta1']");
  });

  it('gives the shards their triggers by the move function, the holder and schemas as literals', () => {
    const text = incomingGuardsSql(
      'm1',
      [
        { shard: 1, schema: 'insta1' },
        { shard: 2, schema: "in'sta2" },
      ],
      'pg2',
    );
    expect(text).toBe(
      `SELECT "shardctl"."shardctl_move_m1_incoming_tables"(s.schema_name, s.shard, 'pg2') FROM unnest(ARRAY['insta1', 'in''sta2']::text[], ARRAY[1, 2]::int[]) AS s(schema_name, shard);`,
    );
    expect(() => incomingGuardsSql('m1', [{ shard: -1, schema: 'x' }], 'pg2')).toThrow('not a shard number: -1');
  });

  it('is a SECURITY DEFINER function with a fixed search_path, passing writes once the shard is active; the move passes by its two settings', () => {
    const text = incomingGuardFunctionSql('m1');
    expect(text).toContain('SECURITY DEFINER SET search_path = pg_catalog, pg_temp');
    expect(text).toContain("state = 'active'");
    expect(text).toContain("USING ERRCODE = 'SC100'");
    expect(text).toContain("'shardctl.copying', 'shardctl.building'");
    expect(text).toContain("s.state = 'incoming'");
  });
});
