//! The ordering rule's aftermath ([`crate::position`] states the rule):
//! after a guarded statement changed fewer rows than it carried, ask which
//! changes the guard held back ([`resolve`]); a change older than its row
//! is reported as not applied, one whose position cannot be compared with
//! its row's is applied in stream order and reported. [`Report`] gathers
//! both per table and logs them once per flush, so a replay of thousands
//! of changes costs a line, not thousands, and no change goes without one.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use sluice_guest::log;
use sluice_guest::sql::{self, SqlError, Value};

use crate::bound::Bound;
use crate::position;
use crate::table::{Column, Dialect, Kind, Table, quote};

/// Examples kept per table and kind for the log line.
const EXAMPLES: usize = 3;

/// What the ordering rule did to the changes of one flush, per table.
#[derive(Debug, Default)]
pub struct Report {
    tables: BTreeMap<String, Held>,
}

/// One table's held-back (`stale`) and stream-ordered (`unordered`)
/// changes: counts and the first few as `key at pos (row at pos)`.
#[derive(Debug, Default)]
struct Held {
    stale: (usize, Vec<String>),
    unordered: (usize, Vec<String>),
}

impl Report {
    /// A change of `table` (key `key`, position `change`) older than its
    /// row's (`row`): not applied.
    pub fn stale(&mut self, table: &str, key: String, change: &str, row: &str) {
        let held = self.tables.entry(table.to_string()).or_default();
        note(&mut held.stale, key, change, row);
    }

    /// A change applied in stream order: its position `change` and its
    /// row's `row` cannot be compared.
    pub fn unordered(&mut self, table: &str, key: String, change: &str, row: &str) {
        let held = self.tables.entry(table.to_string()).or_default();
        note(&mut held.unordered, key, change, row);
    }

    /// Log what was gathered (a warning per table and kind) for `part`,
    /// and start again.
    pub fn log(&mut self, part: &str) {
        for (table, held) in std::mem::take(&mut self.tables) {
            let (n, examples) = held.stale;
            if n > 0 {
                log::warn(format!(
                    "table {table}: {n} change{} of {part} older than {} row{} not applied (a row keeps the source position of its last change; a replay or a re-snapshot sends older ones): {}{}",
                    plural(n),
                    if n == 1 { "its" } else { "their" },
                    plural(n),
                    examples.join("; "),
                    more(n),
                ));
            }
            let (n, examples) = held.unordered;
            if n > 0 {
                log::warn(format!(
                    "table {table}: {n} change{} of {part} applied in stream order: {} source position{} cannot be compared with {} (another form, e.g. a Maxwell bootstrap row without a binlog position, or another Kafka partition): {}{}",
                    plural(n),
                    if n == 1 { "its" } else { "their" },
                    plural(n),
                    if n == 1 { "its row's" } else { "their rows'" },
                    examples.join("; "),
                    more(n),
                ));
            }
        }
    }
}

fn note(held: &mut (usize, Vec<String>), key: String, change: &str, row: &str) {
    held.0 += 1;
    if held.1.len() < EXAMPLES {
        held.1.push(format!("key {key} at {change} (row at {row})"));
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

fn more(n: usize) -> String {
    if n > EXAMPLES {
        format!("; and {} more", n - EXAMPLES)
    } else {
        String::new()
    }
}

/// After a guarded statement of `changes` (all upserts or all deletes of
/// `table`, key columns `key`) changed `applied` rows of `changes.len()`:
/// read the stored positions of their keys, report each change older than
/// its row, and apply each whose position cannot be compared with its
/// row's without the guard (reported too). A delete whose key has no row
/// needs nothing.
///
/// # Errors
/// The database's error on the query or an unguarded statement.
pub fn resolve(
    table: &Table,
    key: &[usize],
    changes: &[Bound],
    applied: u64,
    report: &mut Report,
) -> Result<(), SqlError> {
    if applied >= changes.len() as u64 {
        return Ok(());
    }
    // At most this many parameters a query (SQLite's default limit is
    // 32,766, PostgreSQL's 65,535).
    let per_query = (30_000 / key.len().max(1)).max(1);
    for part in changes.chunks(per_query) {
        positions_of(table, key, part, report)?;
    }
    Ok(())
}

/// [`resolve`] for `changes` whose keys fit one positions query.
fn positions_of(
    table: &Table,
    key: &[usize],
    changes: &[Bound],
    report: &mut Report,
) -> Result<(), SqlError> {
    let params: Vec<Value> = changes.iter().flat_map(|b| b.key_values(key)).collect();
    let rows = sql::query(&table.positions(key, changes.len()), &params)?;
    for row in rows.rows {
        let (Some(i), Some(Value::Text(stored))) = (row.first(), row.get(1)) else {
            continue;
        };
        let i = match i {
            Value::Integer(n) => usize::try_from(*n).ok(),
            Value::Text(t) => t.parse().ok(),
            _ => None,
        };
        let Some(b) = i
            .and_then(|i| i.checked_sub(1))
            .and_then(|i| changes.get(i))
        else {
            continue;
        };
        match position::compare(stored, &b.pos) {
            Some(Ordering::Greater) => {
                report.stale(&table.name, b.key_text(table, key), &b.pos, stored);
            }
            None => {
                apply_unguarded(table, key, b)?;
                report.unordered(&table.name, b.key_text(table, key), &b.pos, stored);
            }
            // Applied (a delete's row written again since?) or equal.
            Some(_) => {}
        }
    }
    Ok(())
}

/// Apply `b` (of `table`, key columns `key`) whatever its row's position.
fn apply_unguarded(table: &Table, key: &[usize], b: &Bound) -> Result<u64, SqlError> {
    crate::bound::apply_chunk(table, key, std::slice::from_ref(b), false).map_err(|e| e.error)
}

impl Table {
    /// The stored positions of `rows` keys (key columns `key`, indexes):
    /// `SELECT i, position` for each key that has a row, `i` its 1-based
    /// number in the list. Placeholders: the key values, row after row,
    /// each cast to its column's type on PostgreSQL (a `VALUES` list is
    /// typed from its own values).
    pub fn positions(&self, key: &[usize], rows: usize) -> String {
        let t = &self.sql_name;
        let pos = quote(&self.position_column().name);
        let names: Vec<String> = (0..key.len()).map(|n| format!("k{n}")).collect();
        let values: Vec<String> = (0..rows.max(1))
            .map(|row| {
                let cells: Vec<String> = key
                    .iter()
                    .enumerate()
                    .map(|(n, &i)| self.placeholder(&self.columns[i], row * key.len() + n + 1))
                    .collect();
                format!("({}, {})", row + 1, cells.join(", "))
            })
            .collect();
        let on: Vec<String> = key
            .iter()
            .zip(&names)
            .map(|(&i, k)| format!("{t}.{} = v.{k}", quote(&self.columns[i].name)))
            .collect();
        format!(
            "WITH v (i, {}) AS (VALUES {}) SELECT v.i, {t}.{pos} FROM v JOIN {t} ON {}",
            names.join(", "),
            values.join(", "),
            on.join(" AND ")
        )
    }

    /// Placeholder `$n` for column `c`, cast where the dialect needs it
    /// (a bit string through `varbit`: a bare `bit` is `bit(1)`).
    fn placeholder(&self, c: &Column, n: usize) -> String {
        match (self.dialect, c.kind) {
            (Dialect::Sqlite, _) | (_, Kind::Binary | Kind::Text) => format!("${n}"),
            (Dialect::Postgres, Kind::Bits) => format!("CAST(CAST(${n} AS TEXT) AS varbit)"),
            (Dialect::Postgres, _) => format!("CAST(CAST(${n} AS TEXT) AS {})", c.cast),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_are_read_with_keys_cast_to_their_columns() {
        let t = crate::table::sample(Dialect::Postgres);
        assert_eq!(
            t.positions(&[0], 2),
            "WITH v (i, k0) AS (VALUES (1, CAST(CAST($1 AS TEXT) AS int8)), (2, CAST(CAST($2 AS TEXT) AS int8))) \
             SELECT v.i, \"company\".\"_sluice_position\" FROM v JOIN \"company\" ON \"company\".\"id\" = v.k0"
        );
        let t = crate::table::sample(Dialect::Sqlite);
        assert!(t.positions(&[0, 1], 1).contains("VALUES (1, $1, $2)"));
    }

    #[test]
    fn a_report_counts_everything_and_keeps_a_few_examples() {
        let mut r = Report::default();
        for n in 0..5 {
            r.stale("t", format!("id={n}"), "mysql:1", "mysql:2");
        }
        r.unordered("u", "id=9".into(), "kafka:x", "mysql:2");
        let t = &r.tables["t"];
        assert_eq!(t.stale.0, 5);
        assert_eq!(t.stale.1.len(), EXAMPLES);
        assert_eq!(t.stale.1[0], "key id=0 at mysql:1 (row at mysql:2)");
        assert_eq!(r.tables["u"].unordered.0, 1);
        assert_eq!(more(5), "; and 2 more");
        assert_eq!(more(3), "");
    }
}
