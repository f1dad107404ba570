/**
 * The 64-bit id: `[sign 0][time: timeBits][shard: shardBits][sequence: sequenceBits]`.
 *
 * timeBits = 63 - shardBits - sequenceBits: the sign bit is never used, so an id is never
 * negative. With the defaults (13 shard bits, 10 sequence bits) that leaves 40 time bits,
 * 2^40 ms = 34.8 years after the epoch.
 *
 * Everything here is bigint: ids pass 2^53 about 12 days after the epoch.
 */

export interface IdLayout {
  /** Milliseconds since the Unix epoch of the layout's custom epoch. */
  readonly epochMs: bigint;
  readonly shardBits: number;
  readonly sequenceBits: number;
}

/** Instagram's published epoch (1314220021721 ms after the Unix epoch). */
export const DEFAULT_EPOCH_ISO = '2011-08-24T21:07:01.721Z';

/** Instagram's epoch and bit split: the default layout. */
export const DEFAULT_ID_LAYOUT: IdLayout = Object.freeze({
  epochMs: BigInt(Date.parse(DEFAULT_EPOCH_ISO)),
  shardBits: 13,
  sequenceBits: 10,
});

export function timeBits(layout: IdLayout): number {
  return 63 - layout.shardBits - layout.sequenceBits;
}

/** Largest time offset (ms after the epoch) the layout can hold. */
export function maxTimeOffsetMs(layout: IdLayout): bigint {
  return (1n << BigInt(timeBits(layout))) - 1n;
}

/** The first Unix millisecond the layout can no longer represent. */
export function layoutEndUnixMs(layout: IdLayout): bigint {
  return layout.epochMs + (1n << BigInt(timeBits(layout)));
}

export function maxShards(layout: IdLayout): number {
  return 2 ** layout.shardBits;
}

/** A short human description used in errors, e.g. in the SQL function's overflow message. */
export function describeLayout(layout: IdLayout): string {
  return (
    `epoch ${formatUnixMs(layout.epochMs)}, ${timeBits(layout)} time bits, ` +
    `${layout.shardBits} shard bits, ${layout.sequenceBits} sequence bits`
  );
}

export interface IdParts {
  /** Milliseconds since the Unix epoch. */
  readonly unixMs: bigint;
  readonly shard: number;
  readonly sequence: number;
}

export interface DecodedId extends IdParts {
  readonly id: bigint;
  /** ISO 8601, UTC. */
  readonly timestamp: string;
}

export class IdRangeError extends RangeError {}

export function encodeId(parts: IdParts, layout: IdLayout): bigint {
  const offset = parts.unixMs - layout.epochMs;
  if (offset < 0n) {
    throw new IdRangeError(
      `time ${formatUnixMs(parts.unixMs)} is before the layout's epoch (${describeLayout(layout)})`,
    );
  }
  if (offset > maxTimeOffsetMs(layout)) {
    throw new IdRangeError(
      `time ${formatUnixMs(parts.unixMs)} is past the end of the layout (${describeLayout(layout)}; ` +
        `last representable time ${formatUnixMs(layoutEndUnixMs(layout) - 1n)})`,
    );
  }
  checkField('shard', parts.shard, layout.shardBits);
  checkField('sequence', parts.sequence, layout.sequenceBits);
  const seqBits = BigInt(layout.sequenceBits);
  return (offset << (BigInt(layout.shardBits) + seqBits)) | (BigInt(parts.shard) << seqBits) | BigInt(parts.sequence);
}

export function decodeId(id: bigint, layout: IdLayout): DecodedId {
  if (id < 0n || id > 0x7fff_ffff_ffff_ffffn) {
    throw new IdRangeError(`id ${id} is not a positive 64-bit integer`);
  }
  const seqBits = BigInt(layout.sequenceBits);
  const shardBits = BigInt(layout.shardBits);
  const sequence = Number(id & ((1n << seqBits) - 1n));
  const shard = Number((id >> seqBits) & ((1n << shardBits) - 1n));
  const unixMs = (id >> (seqBits + shardBits)) + layout.epochMs;
  return { id, unixMs, shard, sequence, timestamp: formatUnixMs(unixMs) };
}

/** Parses a decimal id string strictly (no signs, no spaces, no exponent); undefined if invalid. */
export function parseIdString(text: string): bigint | undefined {
  if (!/^\d{1,19}$/.test(text)) return undefined;
  const id = BigInt(text);
  return id <= 0x7fff_ffff_ffff_ffffn ? id : undefined;
}

export function formatUnixMs(unixMs: bigint): string {
  const date = new Date(Number(unixMs));
  return Number.isNaN(date.getTime()) ? `${unixMs} ms` : date.toISOString();
}

function checkField(name: string, value: number, bits: number): void {
  if (!Number.isInteger(value) || value < 0 || value >= 2 ** bits) {
    throw new IdRangeError(`${name} ${value} does not fit in ${bits} bits (0..${2 ** bits - 1})`);
  }
}
