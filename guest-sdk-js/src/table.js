// `Table`: a table kept current by upserts and deletes, written in
// multi-row statements — the Rust SDK's `sql::Table` in JavaScript,
// sending the same statements.
//
// PostgreSQL answers each statement of a batch on its own, so one
// statement carrying 64 rows does the work of 64 one-row statements at
// about 6× their rate (docs/benchmarks.md, session 15). The statements are
// the portable `INSERT … ON CONFLICT (key) DO UPDATE SET c = excluded.c`
// and `DELETE … WHERE key IN (…)` (a row value `(a, b) IN ((…), …)` for a
// key of several columns).

import { Fatal } from './errors.js';
import { SqlError, executeBatch, identifier, toWit } from './sql.js';

/** Rows per multi-row statement, at most. */
export const ROWS_PER_STATEMENT = 64;

/** Parameters per statement, at most (SQLite's default limit). */
export const MAX_PARAMS = 32_766;

const placeholders = (first, n) => `(${Array.from({ length: n }, (_, i) => `$${first + i}`).join(', ')})`;
const groups = (n, width) => Array.from({ length: n }, (_, r) => placeholders(1 + r * width, width)).join(', ');

// A key column's value as a Map key: equal SQL values give equal keys.
function keyPart(v) {
  const w = toWit(v);
  if (w.tag === 'blob') return `blob:${Array.from(w.val, (b) => b.toString(16).padStart(2, '0')).join('')}`;
  return `${w.tag}:${String(w.val)}`;
}

/**
 * A table that a sink keeps current from upserts and deletes (a row per
 * primary key).
 *
 * `new Table(name, columns, key)`: `key` is the primary key (or a unique
 * constraint), a non-empty subset of `columns`; the table must exist when
 * `apply` runs (create it in `Sink.init`). Throws `Fatal` for a name that
 * is not a plain SQL identifier, no columns, a repeated name or a key
 * column that is not a column.
 */
export class Table {
  constructor(name, columns, key) {
    name = identifier('table', name);
    if (typeof columns === 'string' || typeof key === 'string') {
      throw new Fatal(`table ${name}: columns and key are arrays of names, not strings`);
    }
    columns = [...columns];
    key = [...key];
    for (const c of [...columns, ...key]) identifier('column', c);
    if (!columns.length || !key.length || new Set(columns).size !== columns.length || new Set(key).size !== key.length) {
      throw new Fatal(`table ${name}: needs at least one column and one key column, each named once`);
    }
    const missing = key.filter((k) => !columns.includes(k));
    if (missing.length) throw new Fatal(`table ${name}: key column ${missing[0]} is not a column`);
    this.columns = columns.length;
    this.keyAt = key.map((k) => columns.indexOf(k));
    this.rowsPerStatement = Math.max(1, Math.min(ROWS_PER_STATEMENT, Math.floor(MAX_PARAMS / columns.length)));
    const listed = columns.join(', ');
    const keys = key.join(', ');
    const sets = columns.filter((c) => !key.includes(c)).map((c) => `${c} = excluded.${c}`);
    const conflict = sets.length
      ? `ON CONFLICT (${keys}) DO UPDATE SET ${sets.join(', ')}`
      : `ON CONFLICT (${keys}) DO NOTHING`;
    const upsert = (rows) => `INSERT INTO ${name} (${listed}) VALUES ${groups(rows, columns.length)} ${conflict}`;
    this.upsertOne = upsert(1);
    this.upsertMany = upsert(this.rowsPerStatement);
    this.deleteOne = `DELETE FROM ${name} WHERE ${key.map((k, i) => `${k} = $${i + 1}`).join(' AND ')}`;
    this.deleteMany =
      key.length === 1
        ? `DELETE FROM ${name} WHERE ${key[0]} IN ${placeholders(1, this.rowsPerStatement)}`
        : `DELETE FROM ${name} WHERE (${keys}) IN (${groups(this.rowsPerStatement, key.length)})`;
  }

  /**
   * Apply `changes` — `['upsert', [values of every column]]` or
   * `['delete', [values of the key columns]]` — in order, so each row ends
   * as if they had been applied one by one: consecutive changes of one
   * kind go together; within a run of upserts only each key's last one is
   * sent (never folding a key with a null); whole groups of 64 rows go in
   * multi-row statements, the rest one row per statement. Returns the
   * rows changed.
   *
   * Throws `SqlError` whose `row` is the index in `changes` of the change
   * the failing statement carried (its first, for a multi-row one).
   */
  apply(changes) {
    let changed = 0;
    for (const [kind, multi, rows, origin] of this.plan([...changes])) {
      const statement = kind === 'upsert' ? (multi ? this.upsertMany : this.upsertOne) : multi ? this.deleteMany : this.deleteOne;
      try {
        changed += executeBatch(statement, rows);
      } catch (e) {
        if (!(e instanceof SqlError)) throw e;
        throw new SqlError(e.message, e.code, origin[e.row ?? 0]);
      }
    }
    return changed;
  }

  plan(changes) {
    const steps = [];
    let run = [];
    let kind = null;
    changes.forEach(([k, values], i) => {
      if (k !== 'upsert' && k !== 'delete') {
        throw new SqlError(`a change is ['upsert', values] or ['delete', key values], not ${JSON.stringify(k)}`, 'sluice', i);
      }
      const width = k === 'upsert' ? this.columns : this.keyAt.length;
      if (values.length !== width) {
        throw new SqlError(`${k === 'upsert' ? 'an' : 'a'} ${k} change carries ${values.length} values, the table takes ${width}`, 'sluice', i);
      }
      if (kind !== null && kind !== k) {
        this.flush(kind, run, steps);
        run = [];
      }
      kind = k;
      run.push([i, [...values]]);
    });
    if (kind !== null) this.flush(kind, run, steps);
    return steps;
  }

  flush(kind, run, steps) {
    if (kind === 'upsert') {
      const hasNull = (row) => this.keyAt.some((k) => row[k] === null || row[k] === undefined);
      const keyOf = (row) => JSON.stringify(this.keyAt.map((k) => keyPart(row[k])));
      const last = new Map();
      run.forEach(([, row], n) => {
        if (!hasNull(row)) last.set(keyOf(row), n);
      });
      run = run.filter(([, row], n) => hasNull(row) || last.get(keyOf(row)) === n);
    }
    const size = this.rowsPerStatement;
    const whole = Math.floor(run.length / size) * size;
    if (whole > 0) {
      const rows = [];
      const origin = [];
      for (let j = 0; j < whole; j += size) {
        const chunk = run.slice(j, j + size);
        rows.push(chunk.flatMap(([, row]) => row));
        origin.push(chunk[0][0]);
      }
      steps.push([kind, true, rows, origin]);
    }
    if (whole < run.length) {
      const rest = run.slice(whole);
      steps.push([kind, false, rest.map(([, row]) => row), rest.map(([i]) => i)]);
    }
  }
}
