//! [`Table`]: a table kept current by upserts and deletes, written in
//! multi-row statements.
//!
//! PostgreSQL answers each statement of a batch on its own, so one
//! statement that carries 64 rows does the work of 64 one-row statements
//! at about 6× their rate (docs/benchmarks.md, session 15); SQLite gains
//! less but loses nothing. The statements are the portable
//! `INSERT … ON CONFLICT (key) DO UPDATE SET c = excluded.c` (SQLite 3.24+,
//! PostgreSQL 9.5+) and `DELETE … WHERE key IN (…)` (a row value
//! `(a, b) IN ((…), …)` for a key of several columns: SQLite 3.37+;
//! the host's bundled SQLite is newer).

use std::collections::HashMap;

use super::types::{BatchError, Value};
use super::{execute_batch, identifier};

/// Rows per multi-row statement, at most: more gained nothing measurable
/// in the company sink (docs/benchmarks.md, session 15).
const ROWS_PER_STATEMENT: usize = 64;

/// Parameters per statement, at most: SQLite's default limit
/// (`SQLITE_MAX_VARIABLE_NUMBER`, 32,766 since 3.32); PostgreSQL's is
/// 65,535.
const MAX_PARAMS: usize = 32_766;

/// One change of a [`Table`]'s row.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// Insert the row, or replace the row with its key: one value per
    /// column, in the order given to [`Table::new`].
    Upsert(Vec<Value>),
    /// Delete the row with this key: one value per key column, in the
    /// order given to [`Table::new`].
    Delete(Vec<Value>),
}

/// A table that a sink keeps current from a stream of upserts and
/// deletes (a row per primary key), written in multi-row statements.
///
/// ```no_run
/// use sluice_guest::sql::{Change, Table, Value};
/// # fn f() -> Result<(), sluice_guest::Error> {
/// let t = Table::new("companies", &["pk", "row_json"], &["pk"])?;
/// t.apply(vec![
///     Change::Upsert(vec![Value::from("1"), Value::from(r#"{"id":1}"#)]),
///     Change::Delete(vec![Value::from("2")]),
/// ])
/// .map_err(|e| e.error)?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Table {
    columns: usize,
    /// Positions of the key columns among the columns.
    key: Vec<usize>,
    rows_per_statement: usize,
    upsert_one: String,
    upsert_many: String,
    delete_one: String,
    delete_many: String,
}

/// `(${first}, ${first+1}, …)` for `n` parameters from `first` on.
fn placeholders(first: usize, n: usize) -> String {
    let list: Vec<String> = (first..first + n).map(|i| format!("${i}")).collect();
    format!("({})", list.join(", "))
}

/// `n` groups of `width` placeholders, numbered on from `$1`.
fn groups(n: usize, width: usize) -> String {
    (0..n)
        .map(|r| placeholders(1 + r * width, width))
        .collect::<Vec<_>>()
        .join(", ")
}

impl Table {
    /// A table `name` with `columns`, whose primary key (or a unique
    /// constraint) is `key`, a non-empty subset of `columns`. The table
    /// must exist when [`Table::apply`] runs (create it in `Sink::init`).
    ///
    /// # Errors
    /// [`crate::Error::Fatal`] for a name that is not a plain identifier
    /// ([`identifier`]), no columns, or a key column that is not one of
    /// the columns.
    pub fn new(name: &str, columns: &[&str], key: &[&str]) -> Result<Table, crate::Error> {
        let name = identifier("table", name)?;
        for c in columns.iter().chain(key) {
            identifier("column", c)?;
        }
        let repeated = |names: &[&str]| {
            names
                .iter()
                .enumerate()
                .any(|(i, n)| names[..i].contains(n))
        };
        if columns.is_empty() || key.is_empty() || repeated(columns) || repeated(key) {
            return Err(crate::Error::fatal(format!(
                "table {name}: needs at least one column and one key column, each named once"
            )));
        }
        let key_at = key
            .iter()
            .map(|k| {
                columns.iter().position(|c| c == k).ok_or_else(|| {
                    crate::Error::fatal(format!("table {name}: key column {k} is not a column"))
                })
            })
            .collect::<Result<Vec<usize>, _>>()?;
        let rows_per_statement = ROWS_PER_STATEMENT.min(MAX_PARAMS / columns.len()).max(1);
        let list = columns.join(", ");
        let keys = key.join(", ");
        let set: Vec<String> = columns
            .iter()
            .filter(|c| !key.contains(c))
            .map(|c| format!("{c} = excluded.{c}"))
            .collect();
        let on_conflict = if set.is_empty() {
            format!("ON CONFLICT ({keys}) DO NOTHING")
        } else {
            format!("ON CONFLICT ({keys}) DO UPDATE SET {}", set.join(", "))
        };
        let upsert = |rows: usize| {
            format!(
                "INSERT INTO {name} ({list}) VALUES {} {on_conflict}",
                groups(rows, columns.len())
            )
        };
        let delete = |rows: usize| match key {
            [one] => format!(
                "DELETE FROM {name} WHERE {one} IN {}",
                placeholders(1, rows)
            ),
            _ => format!(
                "DELETE FROM {name} WHERE ({keys}) IN ({})",
                groups(rows, key.len())
            ),
        };
        Ok(Table {
            columns: columns.len(),
            key: key_at,
            rows_per_statement,
            upsert_one: upsert(1),
            upsert_many: upsert(rows_per_statement),
            delete_one: format!(
                "DELETE FROM {name} WHERE {}",
                key.iter()
                    .enumerate()
                    .map(|(i, k)| format!("{k} = ${}", i + 1))
                    .collect::<Vec<_>>()
                    .join(" AND ")
            ),
            delete_many: delete(rows_per_statement),
        })
    }

    /// Apply `changes` in order, so that each row ends as if they had
    /// been applied one by one: consecutive changes of one kind (a run)
    /// go together; within a run of upserts only each key's last one is
    /// sent (an upsert replaces the whole row, and PostgreSQL refuses an
    /// `ON CONFLICT DO UPDATE` that touches one row twice, SQLSTATE 21000),
    /// so triggers see only those. Each run is sent as whole multi-row
    /// statements, the rest one row per statement, all through
    /// [`execute_batch`]. Returns the rows changed.
    ///
    /// Keys are folded by their exact values: give each key column its
    /// values in one type (a text key always as [`Value::Text`]); keys the
    /// database takes as equal but that differ here (integer 1 and real
    /// 1.0, a case-insensitive collation) may meet in one statement, which
    /// PostgreSQL refuses. A key with a NULL is never folded. The order
    /// kept is the key's: a second unique constraint of the table may see
    /// the run's upserts in another order than one by one.
    ///
    /// # Errors
    /// A [`BatchError`] whose `row` is the index in `changes` of the
    /// change the failing statement carried (its first, for a multi-row
    /// one), with the database's error; a change with the wrong number of
    /// values fails before anything is sent. The host rolls the part back
    /// in either case.
    pub fn apply(&self, changes: Vec<Change>) -> Result<u64, BatchError> {
        let mut changed = 0;
        for step in self.plan(changes)? {
            let (one, many) = match step.kind {
                Kind::Upsert => (&self.upsert_one, &self.upsert_many),
                Kind::Delete => (&self.delete_one, &self.delete_many),
            };
            let statement = if step.multi { many } else { one };
            changed += execute_batch(statement, &step.rows).map_err(|e| BatchError {
                row: step.origin.get(e.row).copied().unwrap_or_default(),
                error: e.error,
            })?;
        }
        Ok(changed)
    }

    /// The statements `apply` sends, in order.
    fn plan(&self, changes: Vec<Change>) -> Result<Vec<Step>, BatchError> {
        let mut steps = Vec::new();
        let mut run: Vec<(usize, Vec<Value>)> = Vec::new();
        let mut kind = None;
        for (i, change) in changes.into_iter().enumerate() {
            let (k, values, width) = match change {
                Change::Upsert(v) => (Kind::Upsert, v, self.columns),
                Change::Delete(v) => (Kind::Delete, v, self.key.len()),
            };
            if values.len() != width {
                return Err(BatchError {
                    row: i,
                    error: super::SqlError {
                        message: format!(
                            "{} change carries {} values, the table takes {width}",
                            match k {
                                Kind::Upsert => "an upsert",
                                Kind::Delete => "a delete",
                            },
                            values.len()
                        ),
                        code: "sluice".into(),
                    },
                });
            }
            if kind.is_some_and(|prev| prev != k) {
                self.flush(kind, &mut run, &mut steps);
            }
            kind = Some(k);
            run.push((i, values));
        }
        self.flush(kind, &mut run, &mut steps);
        Ok(steps)
    }

    /// Turn the run of `kind` into steps and empty it.
    fn flush(&self, kind: Option<Kind>, run: &mut Vec<(usize, Vec<Value>)>, steps: &mut Vec<Step>) {
        let Some(kind) = kind else {
            return;
        };
        let mut kept = std::mem::take(run);
        if kind == Kind::Upsert {
            // A key with a NULL in it matches no other row (SQL's NULLs
            // are distinct in a unique constraint): never folded.
            let key = |row: &[Value]| {
                let values = self.key.iter().map(|&k| &row[k]);
                (!values.clone().any(|v| *v == Value::Null)).then(|| key_bytes(values))
            };
            let mut last = HashMap::with_capacity(kept.len());
            for (n, (_, row)) in kept.iter().enumerate() {
                if let Some(k) = key(row) {
                    last.insert(k, n);
                }
            }
            let mut n = 0;
            kept.retain(|(_, row)| {
                let keep = key(row).is_none_or(|k| last.get(&k) == Some(&n));
                n += 1;
                keep
            });
        }
        let whole = kept.len() / self.rows_per_statement * self.rows_per_statement;
        let rest = kept.split_off(whole);
        if !kept.is_empty() {
            let mut origin = Vec::new();
            let mut rows = Vec::new();
            let mut groups = kept.into_iter().peekable();
            while groups.peek().is_some() {
                let group: Vec<(usize, Vec<Value>)> =
                    groups.by_ref().take(self.rows_per_statement).collect();
                origin.push(group[0].0);
                rows.push(group.into_iter().flat_map(|(_, v)| v).collect());
            }
            steps.push(Step {
                kind,
                multi: true,
                rows,
                origin,
            });
        }
        if !rest.is_empty() {
            let (origin, rows) = rest.into_iter().unzip();
            steps.push(Step {
                kind,
                multi: false,
                rows,
                origin,
            });
        }
    }
}

/// What a run changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Upsert,
    Delete,
}

/// One `execute_batch` call of [`Table::apply`].
#[derive(Debug)]
struct Step {
    kind: Kind,
    /// The multi-row statement (each parameter row carries a group).
    multi: bool,
    rows: Vec<Vec<Value>>,
    /// Per parameter row, the index of the (first) change it carries.
    origin: Vec<usize>,
}

/// A key's values as bytes that compare equal exactly when the values do
/// (a tag per value, lengths before text and bytes).
fn key_bytes<'a>(values: impl Iterator<Item = &'a Value>) -> Vec<u8> {
    let mut out = Vec::new();
    for v in values {
        match v {
            Value::Null => out.push(0),
            Value::Integer(i) => {
                out.push(1);
                out.extend_from_slice(&i.to_le_bytes());
            }
            Value::Real(r) => {
                out.push(2);
                out.extend_from_slice(&r.to_bits().to_le_bytes());
            }
            Value::Text(t) => {
                out.push(3);
                out.extend_from_slice(&t.len().to_le_bytes());
                out.extend_from_slice(t.as_bytes());
            }
            Value::Blob(b) => {
                out.push(4);
                out.extend_from_slice(&b.len().to_le_bytes());
                out.extend_from_slice(b);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up(k: &str, v: i64) -> Change {
        Change::Upsert(vec![Value::from(k), Value::Integer(v)])
    }

    fn del(k: &str) -> Change {
        Change::Delete(vec![Value::from(k)])
    }

    #[test]
    fn statements_are_portable_upserts_and_deletes() {
        let t = Table::new("t", &["k", "v"], &["k"]).unwrap();
        assert_eq!(
            t.upsert_one,
            "INSERT INTO t (k, v) VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET v = excluded.v"
        );
        assert!(t.upsert_many.contains("($127, $128) ON CONFLICT"));
        assert_eq!(t.delete_one, "DELETE FROM t WHERE k = $1");
        assert!(t.delete_many.ends_with("IN ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28, $29, $30, $31, $32, $33, $34, $35, $36, $37, $38, $39, $40, $41, $42, $43, $44, $45, $46, $47, $48, $49, $50, $51, $52, $53, $54, $55, $56, $57, $58, $59, $60, $61, $62, $63, $64)"));
        let two = Table::new("t", &["a", "b", "v"], &["a", "b"]).unwrap();
        assert_eq!(two.delete_one, "DELETE FROM t WHERE a = $1 AND b = $2");
        assert!(
            two.delete_many
                .starts_with("DELETE FROM t WHERE (a, b) IN (($1, $2), ($3, $4)")
        );
        let keys_only = Table::new("t", &["k"], &["k"]).unwrap();
        assert!(keys_only.upsert_one.ends_with("ON CONFLICT (k) DO NOTHING"));
        assert!(Table::new("t; drop", &["k"], &["k"]).is_err());
        assert!(Table::new("t", &["k"], &["x"]).is_err());
    }

    #[test]
    fn runs_keep_the_order_and_the_last_upsert_of_each_key() {
        let t = Table::new("t", &["k", "v"], &["k"]).unwrap();
        let steps = t
            .plan(vec![
                up("a", 1),
                up("b", 1),
                up("a", 2),
                del("a"),
                up("a", 3),
            ])
            .unwrap();
        let shape: Vec<(Kind, bool, Vec<usize>, usize)> = steps
            .iter()
            .map(|s| (s.kind, s.multi, s.origin.clone(), s.rows.len()))
            .collect();
        assert_eq!(
            shape,
            [
                (Kind::Upsert, false, vec![1, 2], 2),
                (Kind::Delete, false, vec![3], 1),
                (Kind::Upsert, false, vec![4], 1),
            ]
        );
        assert_eq!(steps[0].rows[1], vec![Value::from("a"), Value::Integer(2)]);
    }

    #[test]
    fn whole_groups_go_in_multi_row_statements_and_errors_name_the_change() {
        let t = Table::new("t", &["k", "v"], &["k"]).unwrap();
        let changes: Vec<Change> = (0..150).map(|i| up(&format!("k{i}"), i)).collect();
        let steps = t.plan(changes).unwrap();
        let shape: Vec<(bool, Vec<usize>, usize, usize)> = steps
            .iter()
            .map(|s| (s.multi, s.origin.clone(), s.rows.len(), s.rows[0].len()))
            .collect();
        assert_eq!(
            shape,
            [
                (true, vec![0, 64], 2, 128),
                (false, (128..150).collect(), 22, 2),
            ]
        );
        let e = t
            .plan(vec![up("a", 1), del("a"), Change::Delete(vec![])])
            .unwrap_err();
        assert_eq!(e.row, 2);
        assert!(e.error.message.contains("carries 0 values"), "{e}");
    }

    #[test]
    fn keys_of_different_types_do_not_collide() {
        let a = key_bytes([Value::Text("1".into())].iter());
        let b = key_bytes([Value::Integer(1)].iter());
        let c = key_bytes([Value::Text("ab".into()), Value::Text("c".into())].iter());
        let d = key_bytes([Value::Text("a".into()), Value::Text("bc".into())].iter());
        assert_ne!(a, b);
        assert_ne!(c, d);
    }
}
