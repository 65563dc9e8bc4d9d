// `Table`: a table kept current by upserts and deletes, through the
// host's bulk path (`sluice:plugin/sql.apply`, contract 0.2.2, and
// `sql.apply-versioned`, 0.2.3) — the Rust
// SDK's `sql::Table` in JavaScript, making the same host call.
//
// The host folds the changes to each key's last one and sends them as
// multi-row statements of up to 512 rows (the portable `INSERT … ON
// CONFLICT (key) DO UPDATE SET c = excluded.c` and `DELETE … WHERE key IN
// (…)`), or on PostgreSQL, from 256 rows on, by `COPY` and a merge.

import { Fatal } from './errors.js';
import { SqlError, applyChanges, identifier, toWit } from './sqlcore.js';

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
    this.name = name;
    this.columns = columns;
    this.key = key;
  }

  /**
   * Apply `changes` — `['upsert', [values of every column]]` or
   * `['delete', [values of the key columns]]` — so each row ends as if
   * they had been applied one by one, in one host call. The host keeps
   * each key's last change (a delete before it too, so unlisted columns
   * return to their defaults) and sends the deletes, then the upserts, as
   * multi-row statements; a key with a null is never folded. Returns the
   * rows changed, a folded change counted once. Throws `SqlError` whose
   * `row` is the index in `changes` of the change the failing statement
   * carried (its first, for a multi-row one); a change that is not
   * `['upsert' | 'delete', values]` is refused before anything is sent.
   */
  apply(changes) {
    return this.#send(changes, null);
  }

  /**
   * `apply` with a version guard (`sql.apply-versioned`, contract 0.2.3):
   * last writer wins by version, as a change-data-capture sink needs.
   * Each row keeps in `versionColumn` (one of the columns, not a key
   * column) the version of its last applied change; a change applies only
   * where the stored version is null or lies in [`low`, the change's
   * version] as the database compares them (`low` null: no lower bound).
   * An upsert's version is its value for `versionColumn`; a delete is
   * `['delete', [key values..., version]]`. Held-back changes change
   * nothing and are not counted in the result; give a key's changes in
   * version order (each key folds to its last change given, as in
   * `apply`). Throws as `apply`, also for a version column that is not a
   * column or is a key column.
   */
  applyVersioned(versionColumn, low, changes) {
    return this.#send(changes, { column: versionColumn, low: toWit(low) });
  }

  #send(changes, guard) {
    changes = [...changes];
    if (!changes.length) return 0;
    const wit = changes.map((change, i) => {
      const [kind, values] = Array.isArray(change) && change.length === 2 ? change : [change, null];
      if ((kind !== 'upsert' && kind !== 'delete') || !Array.isArray(values)) {
        throw new SqlError(`a change is ['upsert', values] or ['delete', key values], not ${String(kind)}`, 'sluice', i);
      }
      return { tag: kind, val: values.map(toWit) };
    });
    return applyChanges({ table: this.name, columns: this.columns, key: this.key }, wit, guard);
  }
}
