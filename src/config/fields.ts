/**
 * The checks of one config field: a type, then conditions in order, each with the message a person
 * reads when it fails (the first failure is reported). What load.ts needs of a schema library and
 * no more: zod cost every command about 90 ms of CPU time to load, more than the rest of a
 * `migrate --check` on a current fleet.
 */

export type FieldResult<T> = { readonly ok: true; readonly value: T } | { readonly ok: false; readonly message: string };

export class Field<T> {
  private constructor(private readonly check: (value: unknown) => FieldResult<T>) {}

  /** A field of one type: `message` when the value is not of it. */
  static of<T>(isType: (value: unknown) => value is T, message: string): Field<T> {
    return new Field((value) => (isType(value) ? { ok: true, value } : { ok: false, message }));
  }

  parse(value: unknown): FieldResult<T> {
    return this.check(value);
  }

  /** A further condition, checked only on values that passed the ones before. */
  refine(condition: (value: T) => boolean, message: string): Field<T> {
    return new Field((value) => {
      const result = this.check(value);
      if (!result.ok || condition(result.value)) return result;
      return { ok: false, message };
    });
  }

  regex(pattern: RegExp, message: string): Field<T & string> {
    return (this as unknown as Field<T & string>).refine((value) => pattern.test(value), message);
  }

  /** At least `min`: a number's value, a string's or a list's length. */
  min(min: number, message: string): Field<T> {
    return this.refine((value) => measure(value) >= min, message);
  }

  max(max: number, message: string): Field<T> {
    return this.refine((value) => measure(value) <= max, message);
  }

  /** A missing field (undefined) takes `value`, unchecked. */
  default(value: T): Field<T> {
    return new Field((raw) => (raw === undefined ? { ok: true, value } : this.check(raw)));
  }

  optional(): Field<T | undefined> {
    return new Field<T | undefined>((raw) => (raw === undefined ? { ok: true, value: undefined } : this.check(raw)));
  }
}

function measure(value: unknown): number {
  return typeof value === 'number' ? value : (value as { length: number }).length;
}

export const isString = (value: unknown): value is string => typeof value === 'string';
/** Finite numbers only: YAML's `.nan` and `.inf` are not numbers a config means. */
export const isNumber = (value: unknown): value is number => typeof value === 'number' && Number.isFinite(value);
export const isInteger = (value: unknown): value is number => Number.isSafeInteger(value);
export const isBoolean = (value: unknown): value is boolean => typeof value === 'boolean';
export const isList = (value: unknown): value is unknown[] => Array.isArray(value);
export const isAnything = (value: unknown): value is unknown => true;

export type Fields = Record<string, Field<unknown>>;
export type FieldValues<F extends Fields> = { [K in keyof F]?: F[K] extends Field<infer T> ? T : never };
