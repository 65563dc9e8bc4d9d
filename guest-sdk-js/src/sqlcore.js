// What the SQL capability's calls share (`sluice:plugin/sql`): the error
// type, identifier checks, the conversions to and from the bindings'
// values, and the host call of `Table`. `sql.js` and `table.js` both build
// on it; plugins import from `sql.js` (the SDK's `sql`).

import { Fatal } from './errors.js';
import { host } from './host.js';

/** A database error, or a refusal by the host (code `sluice`). `row`: for
 * `executeBatch` and `Table.apply`, the index of the failing row. */
export class SqlError extends Error {
  constructor(message, code = 'sluice', row = null) {
    super(message);
    this.name = 'SqlError';
    this.code = code;
    this.row = row;
  }

  toString() {
    const at = this.row === null ? '' : `row ${this.row}: `;
    return `${at}${this.message} (code ${this.code})`;
  }
}

const IDENT = /^[A-Za-z_][A-Za-z0-9_]{0,62}$/;

/** Check that `name`, the value of setting `what`, is a plain SQL
 * identifier (`[A-Za-z_][A-Za-z0-9_]*`, at most 63 bytes), so it can be
 * put into a statement unquoted on both dialects. Returns it; throws
 * `Fatal` otherwise (for a stage's constructor). */
export function identifier(what, name) {
  if (typeof name !== 'string' || !IDENT.test(name)) {
    throw new Fatal(`${what} \`${name}\` is not a plain SQL identifier ([A-Za-z_][A-Za-z0-9_]*, at most 63 bytes)`);
  }
  return name;
}

export function granted() {
  const s = host().sql();
  if (s === null) throw new SqlError('no sql capability granted (configure the pipeline with --sink-db)');
  return s;
}

const I64_MIN = -(2n ** 63n);
const I64_MAX = 2n ** 63n - 1n;

/** A JavaScript value as the WIT `value` variant. */
export function toWit(v) {
  if (v === null || v === undefined) return { tag: 'null' };
  switch (typeof v) {
    case 'boolean':
      return { tag: 'integer', val: v ? 1n : 0n };
    case 'number':
      if (Number.isSafeInteger(v) && !Object.is(v, -0)) return { tag: 'integer', val: BigInt(v) };
      if (Number.isInteger(v) && !Object.is(v, -0)) {
        throw new TypeError(`${v} is beyond the integers a number holds exactly (±2^53): pass a BigInt`);
      }
      return { tag: 'real', val: v };
    case 'bigint':
      if (v < I64_MIN || v > I64_MAX) throw new TypeError(`an SQL integer must fit 64 bits, not ${v}`);
      return { tag: 'integer', val: v };
    case 'string':
      return { tag: 'text', val: v };
    default:
      if (v instanceof Uint8Array) return { tag: 'blob', val: v };
      throw new TypeError(
        `an SQL parameter must be null, a number, a BigInt, a boolean, a string or a Uint8Array, not ${typeof v}`,
      );
  }
}

/** The WIT `value` variant as a JavaScript value. */
export function fromWit(v) {
  if (v.tag === 'null') return null;
  if (v.tag === 'integer') {
    const n = Number(v.val);
    return Number.isSafeInteger(n) ? n : v.val;
  }
  return v.val;
}

/** The bindings' thrown `sql-error` / `batch-error` as `SqlError`. */
export function asSqlError(e) {
  const err = e && typeof e === 'object' && 'payload' in e ? e.payload : e;
  if (err && typeof err === 'object' && 'row' in err && err.error) {
    return new SqlError(err.error.message, err.error.code, err.row);
  }
  if (err && typeof err === 'object' && 'message' in err && 'code' in err) {
    return new SqlError(err.message, err.code);
  }
  return e;
}

/** `Table.apply`'s host call (`sql.apply`): `target` `{ table, columns,
 * key }`, `changes` already WIT `change` variants; with `guard` (`{
 * column, low }`, `low` a WIT value), `Table.applyVersioned`'s
 * (`sql.apply-versioned`). */
export function applyChanges(target, changes, guard = null) {
  const s = granted();
  try {
    return Number(guard ? s.applyVersioned(target, guard, changes) : s.apply(target, changes));
  } catch (e) {
    throw asSqlError(e);
  }
}
