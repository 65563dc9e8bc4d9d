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

import { host } from './host.js';
import { asSqlError, fromWit, granted, toWit } from './sqlcore.js';

export { SqlError, applyChanges, fromWit, identifier, toWit } from './sqlcore.js';

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

// Re-exported: plugins write `sql.Table`.
export { Table } from './table.js';
