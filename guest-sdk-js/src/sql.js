// The host's SQL capability, for sink stages (`sluice:plugin/sql`).
//
// Every call runs inside the host's transaction for the partition range
// (or part of one) being written; the host commits it together with its
// progress row, so the effect happens exactly once even for SQL that is
// not idempotent. Never begin, commit or roll back yourself. Placeholders
// are `$1 … $n` on SQLite and PostgreSQL.
//
// Parameters and results are JavaScript values: `null` (NULL; `undefined`
// too), a BigInt or a number without a fraction (a 64-bit integer;
// `true`/`false` are 1/0), any other number (a real, also -0, NaN and
// ±Infinity), a string, a Uint8Array. A number without a fraction beyond
// ±2^53 is refused (it may not be the integer meant: use a BigInt).
// Integers come back as numbers when they fit exactly (±2^53), else as
// BigInt. An error is thrown as `SqlError` (with the database's code:
// SQLSTATE, or SQLite's extended code name); left uncaught in a sink stage
// it fails the part (rolled back; the batch is not committed).

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

function granted() {
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
function asSqlError(e) {
  const err = e && typeof e === 'object' && 'payload' in e ? e.payload : e;
  if (err && typeof err === 'object' && 'row' in err && err.error) {
    return new SqlError(err.error.message, err.error.code, err.row);
  }
  if (err && typeof err === 'object' && 'message' in err && 'code' in err) {
    return new SqlError(err.message, err.code);
  }
  return e;
}

/** `'sqlite'` or `'postgres'`; `null` without a connection. */
export function dialect() {
  const s = host().sql();
  return s === null ? null : s.dialect();
}

/** Run one statement; the number of rows changed. */
export function execute(statement, params = []) {
  const s = granted();
  const wit = params.map(toWit);
  try {
    return Number(s.execute(statement, wit));
  } catch (e) {
    throw asSqlError(e);
  }
}

/** Run one statement once per parameter row, in order, in one host call;
 * the total number of rows changed. The same effect as `execute` per row
 * at a fraction of the cost. On an error, `SqlError.row` is the failing
 * row's index. */
export function executeBatch(statement, rows) {
  const s = granted();
  const wit = rows.map((row) => row.map(toWit));
  try {
    return Number(s.executeBatch(statement, wit));
  } catch (e) {
    throw asSqlError(e);
  }
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

/** Run one query: `{ columns, rows }`, `rows` an array of arrays of
 * JavaScript values. The host returns at most 100,000 rows or 64 MiB. */
export function query(statement, params = []) {
  const s = granted();
  const wit = params.map(toWit);
  let r;
  try {
    r = s.query(statement, wit);
  } catch (e) {
    throw asSqlError(e);
  }
  return { columns: r.columns, rows: r.rows.map((row) => row.map(fromWit)) };
}

export { Table } from './table.js';
