//! The bulk path of the SQL capability (`sql.apply`, contract 0.2.2;
//! `sql.apply-versioned`, 0.2.3, with [a version guard](version)): a
//! table's upserts and deletes folded to each key's last change and
//! planned as multi-row statements, which the session then runs through
//! the same checks, role and transaction as a plugin's own statements.
//!
//! Why: PostgreSQL spends most of its time per statement, not per row; a
//! sink that sent a part's changes as one-row statements kept one server
//! core busy at ~45,000 records/s (docs/benchmarks.md, session 23). The
//! statements are the portable `INSERT … ON CONFLICT (key) DO UPDATE SET
//! c = excluded.c` (SQLite 3.24+, PostgreSQL 9.5+) and `DELETE … WHERE
//! key IN (…)` (a row value `(a, b) IN ((…), …)` for a key of several
//! columns: SQLite 3.37+, the bundled library is newer).
//!
//! Statement sizes are powers of two up to [`MAX_ROWS`] rows, so a table
//! has at most a dozen statement texts of each kind: each is checked and
//! prepared once per connection, whatever the changes' count.
//!
//! On PostgreSQL a call with many rows left after the fold goes instead
//! by `COPY` into a temporary table and two statements that merge it
//! (`copy`): the server's cheapest form (docs/benchmarks.md, session 25).

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use super::{DbError, SqlValue};

mod copy;
mod version;
pub use copy::{COPY_MIN_ROWS, ColumnType, CopyPlan, Stage};
pub use version::Version;

/// Rows per statement, at most.
pub const MAX_ROWS: usize = 512;

/// Parameters per statement, at most: SQLite's default limit
/// (`SQLITE_MAX_VARIABLE_NUMBER`, 32,766 since 3.32); PostgreSQL's is
/// 65,535.
pub const MAX_PARAMS: usize = 32_766;

/// Columns of a target, at most: SQLite's default `SQLITE_MAX_COLUMN`
/// (PostgreSQL allows 1,600).
pub const MAX_COLUMNS: usize = 2000;

/// Key columns of a target, at most: PostgreSQL's `INDEX_MAX_KEYS`.
pub const MAX_KEY_COLUMNS: usize = 32;

/// A table kept current by [`plan`] (the WIT `sql.target`), checked,
/// with its version guard for `apply-versioned` ([`Target::versioned`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    table: String,
    columns: Vec<String>,
    /// The table's and the columns' names as the database stores them
    /// ([`stored`]).
    stored: (String, Vec<String>),
    /// Positions of the key columns among the columns.
    key: Vec<usize>,
    version: Option<Version>,
}

/// One change of a [`Target`]'s row (the WIT `sql.change`).
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// The row: one value per column, in the target's column order.
    Upsert(Vec<SqlValue>),
    /// The key: one value per key column, in the target's key order,
    /// then, for a versioned target, the delete's version.
    Delete(Vec<SqlValue>),
}

/// One statement and its parameter rows (each row one execution), as
/// `execute-batch` takes them.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// The statement's text.
    pub sql: String,
    /// Parameters of each execution.
    pub rows: Vec<Vec<SqlValue>>,
    /// Per execution, the index in the changes of the first change it
    /// carries (what a failing execution is reported as).
    pub origin: Vec<usize>,
}

/// The name the database stores for `name`, a plain identifier or a
/// delimited one: the guest SDK's rule
/// ([`sluice_guest::sql::target_name`]), its message as a host error.
fn stored(what: &str, name: &str) -> Result<String, DbError> {
    match sluice_guest::sql::target_name(what, name) {
        Ok(name) => Ok(name),
        Err(sluice_guest::Error::Fatal(m)) => Err(DbError::host(m)),
        Err(e) => Err(DbError::host(e.to_string())),
    }
}

impl Target {
    /// Check a target: plain or delimited identifiers
    /// ([`sluice_guest::sql::target_name`]), at least one column and one
    /// key column, each named once, every key column one of the columns.
    ///
    /// # Errors
    /// A host [`DbError`] (code `sluice`) naming what is wrong.
    pub fn new(table: &str, columns: &[String], key: &[String]) -> Result<Target, DbError> {
        let stored_table = stored("table", table)?;
        let table = table.to_string();
        if columns.len() > MAX_COLUMNS || key.len() > MAX_KEY_COLUMNS {
            return Err(DbError::host(format!(
                "table {table}: {} columns and {} key columns given; at most {MAX_COLUMNS} and {MAX_KEY_COLUMNS}",
                columns.len(),
                key.len()
            )));
        }
        let names = |n: &[String]| {
            n.iter()
                .map(|c| stored("column", c))
                .collect::<Result<Vec<String>, _>>()
        };
        let (stored_columns, stored_key) = (names(columns)?, names(key)?);
        let repeated = |names: &[String]| {
            let mut seen = std::collections::HashSet::with_capacity(names.len());
            !names.iter().all(|n| seen.insert(n))
        };
        if columns.is_empty()
            || key.is_empty()
            || repeated(&stored_columns)
            || repeated(&stored_key)
        {
            return Err(DbError::host(format!(
                "table {table}: needs at least one column and one key column, each named once"
            )));
        }
        let key = key
            .iter()
            .zip(&stored_key)
            .map(|(k, s)| {
                stored_columns.iter().position(|c| c == s).ok_or_else(|| {
                    DbError::host(format!("table {table}: key column {k} is not a column"))
                })
            })
            .collect::<Result<Vec<usize>, _>>()?;
        Ok(Target {
            table,
            stored: (stored_table, stored_columns),
            columns: columns.to_vec(),
            key,
            version: None,
        })
    }

    /// Rows per statement at most: [`MAX_ROWS`], fewer for wide rows, a
    /// power of two.
    fn rows_per_statement(&self, width: usize) -> usize {
        let most = MAX_ROWS.min(MAX_PARAMS / width.max(1)).max(1);
        1 << most.ilog2()
    }

    /// The key columns' names.
    fn key_names(&self) -> Vec<&str> {
        self.key.iter().map(|&k| self.columns[k].as_str()).collect()
    }

    /// `ON CONFLICT (key) DO UPDATE SET c = excluded.c, …` for the
    /// columns not in the key (`DO NOTHING` when there are none).
    fn on_conflict(&self) -> String {
        let keys = self.key_names();
        let set: Vec<String> = self
            .columns
            .iter()
            .filter(|c| !keys.contains(&c.as_str()))
            .map(|c| format!("{c} = excluded.{c}"))
            .collect();
        if set.is_empty() {
            format!("ON CONFLICT ({}) DO NOTHING", keys.join(", "))
        } else {
            format!(
                "ON CONFLICT ({}) DO UPDATE SET {}",
                keys.join(", "),
                set.join(", ")
            )
        }
    }

    /// `rows` rows (each all the columns) inserted or replaced, where
    /// the version guard holds (its low version last).
    fn upsert(&self, rows: usize) -> String {
        let width = self.columns.len();
        let guard = self.version_column().and_then(|v| {
            self.guard(&format!("excluded.{v}"), rows * width + 1)
                .map(|g| format!(" WHERE {g}"))
        });
        format!(
            "INSERT INTO {} ({}) VALUES {} {}{}",
            self.table,
            self.columns.join(", "),
            groups(rows, width),
            self.on_conflict(),
            guard.unwrap_or_default()
        )
    }

    /// `rows` keys deleted; for a versioned target one key, where the
    /// guard holds ([`Target::versioned_delete`]).
    fn delete(&self, rows: usize) -> String {
        if let Some(delete) = self.versioned_delete() {
            return delete;
        }
        let keys = self.key_names();
        match keys.as_slice() {
            [one] if rows == 1 => format!("DELETE FROM {} WHERE {one} = $1", self.table),
            [one] => format!(
                "DELETE FROM {} WHERE {one} IN {}",
                self.table,
                placeholders(1, rows)
            ),
            _ => format!(
                "DELETE FROM {} WHERE ({}) IN ({})",
                self.table,
                keys.join(", "),
                groups(rows, keys.len())
            ),
        }
    }
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

/// A call's changes after [`fold`].
#[derive(Debug, Clone, PartialEq)]
pub enum Folded {
    /// Nothing folded (a key column got values of two types): every
    /// change, in order.
    InOrder(Vec<Change>),
    /// What is left to apply: the deletes (key values), in the order of
    /// the changes, then the upserts (rows), each key's last; each with
    /// its index in the changes.
    Sets {
        /// Keys to delete.
        deletes: Vec<(usize, Vec<SqlValue>)>,
        /// Rows to insert or replace.
        upserts: Vec<(usize, Vec<SqlValue>)>,
    },
}

/// The statements that apply `changes` to `target`, in order: the
/// deletes, then the upserts ([`fold`], then [`statements`]).
///
/// # Errors
/// As [`fold`].
pub fn plan(target: &Target, changes: Vec<Change>) -> Result<Vec<Step>, (usize, DbError)> {
    Ok(statements(target, fold(target, changes)?))
}

/// What of `changes` is left to apply to `target`.
///
/// Each key's changes fold to its last: a last delete deletes; a last
/// upsert is sent alone, after a delete of the key when one of its
/// earlier changes was a delete (so columns the upsert does not list get
/// their defaults again, as one by one). Keys compare by exact value
/// (-0.0 as 0.0); a key with a NULL is never folded (it matches no row).
/// When a key column gets values of two types in one call (integer 1 and
/// text "1" may be one row to the database), nothing is folded: every
/// change goes, in order ([`Folded::InOrder`]: one-row statements).
///
/// # Errors
/// The index in `changes` of a change with the wrong number of values,
/// before any statement.
pub fn fold(target: &Target, changes: Vec<Change>) -> Result<Folded, (usize, DbError)> {
    // Per key: the index of its last change and of its last delete.
    let mut last: HashMap<Vec<u8>, (usize, Option<usize>)> = HashMap::new();
    let mut keys = Vec::with_capacity(changes.len());
    // The type of each key column's non-NULL values so far, and whether
    // one got two.
    let mut types: Vec<Option<std::mem::Discriminant<SqlValue>>> = vec![None; target.key.len()];
    let mut mixed = false;
    for (i, change) in changes.iter().enumerate() {
        let (values, width, what) = match change {
            Change::Upsert(v) => (v, target.columns.len(), "an upsert"),
            Change::Delete(v) => (v, target.delete_width(), "a delete"),
        };
        if values.len() != width {
            return Err((
                i,
                DbError::host(format!(
                    "{what} change carries {} values, table {} takes {width}",
                    values.len(),
                    target.table
                )),
            ));
        }
        let key: Vec<&SqlValue> = match change {
            Change::Upsert(v) => target.key.iter().map(|&k| &v[k]).collect(),
            Change::Delete(v) => v[..target.key.len()].iter().collect(),
        };
        for (seen, value) in types.iter_mut().zip(&key) {
            if **value != SqlValue::Null {
                let t = std::mem::discriminant(*value);
                mixed |= *seen.get_or_insert(t) != t;
            }
        }
        let key = (!key.contains(&&SqlValue::Null)).then(|| key_bytes(key.into_iter()));
        if let Some(k) = &key {
            let deleted = matches!(change, Change::Delete(_)).then_some(i);
            match last.entry(k.clone()) {
                Entry::Occupied(mut e) => {
                    let (at, del) = e.get_mut();
                    *at = i;
                    *del = deleted.or(*del);
                }
                Entry::Vacant(e) => {
                    e.insert((i, deleted));
                }
            }
        }
        keys.push(key);
    }
    if mixed {
        return Ok(Folded::InOrder(changes));
    }
    let mut deletes: Vec<(usize, Vec<SqlValue>)> = Vec::new();
    let mut upserts: Vec<(usize, Vec<SqlValue>)> = Vec::new();
    // Deletes kept to run before their key's last upsert, by index.
    let mut before: HashMap<usize, Vec<SqlValue>> = HashMap::new();
    for (i, (change, key)) in changes.into_iter().zip(keys).enumerate() {
        let (at, deleted) = match &key {
            Some(k) => last.get(k).copied().unwrap_or((i, None)),
            None => (i, None),
        };
        if at != i {
            if let (Change::Delete(v), Some(true)) = (change, deleted.map(|d| d == i)) {
                before.insert(i, v);
            }
            continue;
        }
        match change {
            Change::Delete(v) => deletes.push((i, v)),
            Change::Upsert(v) => {
                if let Some(delete) = deleted.and_then(|d| before.remove(&d).map(|k| (d, k))) {
                    deletes.push(delete);
                }
                upserts.push((i, v));
            }
        }
    }
    deletes.sort_by_key(|(i, _)| *i);
    Ok(Folded::Sets { deletes, upserts })
}

/// The multi-row statements of `folded` (one-row ones, in order, for
/// [`Folded::InOrder`]).
pub fn statements(target: &Target, folded: Folded) -> Vec<Step> {
    let (deletes, upserts) = match folded {
        Folded::InOrder(changes) => return in_order(target, changes),
        Folded::Sets { deletes, upserts } => (deletes, upserts),
    };
    let mut steps = Vec::new();
    let tail = target.tail();
    let delete_rows = match target.version {
        Some(_) => 1,
        None => target.rows_per_statement(target.key.len()),
    };
    cut(
        deletes,
        delete_rows,
        |n| target.delete(n),
        &tail,
        &mut steps,
    );
    cut(
        upserts,
        target.rows_per_statement(target.columns.len() + tail.len()),
        |n| target.upsert(n),
        &tail,
        &mut steps,
    );
    steps
}

/// Every change as a one-row statement, in order (consecutive changes of
/// one kind in one step).
fn in_order(target: &Target, changes: Vec<Change>) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    let tail = target.tail();
    for (i, change) in changes.into_iter().enumerate() {
        let (sql, mut values) = match change {
            Change::Upsert(v) => (target.upsert(1), v),
            Change::Delete(v) => (target.delete(1), v),
        };
        values.extend(tail.iter().cloned());
        match steps.last_mut() {
            Some(step) if step.sql == sql => {
                step.rows.push(values);
                step.origin.push(i);
            }
            _ => steps.push(Step {
                sql,
                rows: vec![values],
                origin: vec![i],
            }),
        }
    }
    steps
}

/// Cut `rows` into statements of `most` rows (one step, an execution per
/// statement) and the rest into statements of the powers of two it is
/// made of, largest first; each execution's values end with `tail`.
fn cut(
    rows: Vec<(usize, Vec<SqlValue>)>,
    most: usize,
    text: impl Fn(usize) -> String,
    tail: &[SqlValue],
    steps: &mut Vec<Step>,
) {
    let mut rows = rows.into_iter().peekable();
    let mut left = rows.len();
    let mut size = most;
    while left > 0 {
        let count = left / size;
        if count > 0 {
            let mut step = Step {
                sql: text(size),
                rows: Vec::with_capacity(count),
                origin: Vec::with_capacity(count),
            };
            for _ in 0..count {
                let group: Vec<(usize, Vec<SqlValue>)> = rows.by_ref().take(size).collect();
                step.origin.push(group[0].0);
                let mut values: Vec<SqlValue> = group.into_iter().flat_map(|(_, v)| v).collect();
                values.extend_from_slice(tail);
                step.rows.push(values);
            }
            steps.push(step);
            left -= count * size;
        }
        size /= 2;
    }
}

/// A key's values as bytes that compare equal exactly when the values do
/// (a tag per value, lengths before text and bytes).
fn key_bytes<'a>(values: impl Iterator<Item = &'a SqlValue>) -> Vec<u8> {
    let mut out = Vec::new();
    for v in values {
        match v {
            SqlValue::Null => out.push(0),
            SqlValue::Integer(i) => {
                out.push(1);
                out.extend_from_slice(&i.to_le_bytes());
            }
            SqlValue::Real(r) => {
                out.push(2);
                // -0.0 and 0.0 are one key to the database.
                let r = if *r == 0.0 { 0.0f64 } else { *r };
                out.extend_from_slice(&r.to_bits().to_le_bytes());
            }
            SqlValue::Text(t) => {
                out.push(3);
                out.extend_from_slice(&t.len().to_le_bytes());
                out.extend_from_slice(t.as_bytes());
            }
            SqlValue::Blob(b) => {
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

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    fn target(columns: &[&str], key: &[&str]) -> Target {
        Target::new("t", &names(columns), &names(key)).unwrap()
    }

    fn up(k: &str, v: i64) -> Change {
        Change::Upsert(vec![SqlValue::Text(k.into()), SqlValue::Integer(v)])
    }

    fn del(k: &str) -> Change {
        Change::Delete(vec![SqlValue::Text(k.into())])
    }

    /// (kind and rows of the statement, executions, origins) per step,
    /// for a target of two columns and a key of one.
    fn shape(steps: &[Step]) -> Vec<(String, usize, Vec<usize>)> {
        steps
            .iter()
            .map(|s| {
                let params = s.sql.matches('$').count();
                let (kind, rows) = if s.sql.starts_with("DELETE") {
                    ("delete", params)
                } else {
                    ("upsert", params / 2)
                };
                (format!("{kind}{rows}"), s.rows.len(), s.origin.clone())
            })
            .collect()
    }

    #[test]
    fn statements_are_portable_upserts_and_deletes() {
        let t = target(&["k", "v"], &["k"]);
        assert_eq!(
            t.upsert(1),
            "INSERT INTO t (k, v) VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET v = excluded.v"
        );
        assert!(t.upsert(4).contains("($7, $8) ON CONFLICT"));
        assert_eq!(t.delete(1), "DELETE FROM t WHERE k = $1");
        assert_eq!(t.delete(3), "DELETE FROM t WHERE k IN ($1, $2, $3)");
        let two = target(&["a", "b", "v"], &["a", "b"]);
        assert_eq!(
            two.delete(2),
            "DELETE FROM t WHERE (a, b) IN (($1, $2), ($3, $4))"
        );
        assert_eq!(two.delete(1), "DELETE FROM t WHERE (a, b) IN (($1, $2))");
        let keys_only = target(&["k"], &["k"]);
        assert!(keys_only.upsert(1).ends_with("ON CONFLICT (k) DO NOTHING"));
        for (table, columns, key) in [
            ("t; drop", vec!["k"], vec!["k"]),
            ("t", vec!["k"], vec!["x"]),
            ("t", vec!["k", "k"], vec!["k"]),
            ("t", vec![], vec![]),
            ("t", vec!["k\""], vec!["k\""]),
        ] {
            assert!(
                Target::new(table, &names(&columns), &names(&key)).is_err(),
                "{table} {columns:?}"
            );
        }
        // Wide rows: fewer rows a statement, still a power of two.
        let wide: Vec<String> = (0..100).map(|i| format!("c{i}")).collect();
        let w = Target::new("t", &wide, &wide[..1]).unwrap();
        assert_eq!(w.rows_per_statement(100), 256);
        assert_eq!(w.rows_per_statement(1), MAX_ROWS);
    }

    #[test]
    fn each_key_keeps_its_last_change_deletes_first() {
        let t = target(&["k", "v"], &["k"]);
        let steps = plan(
            &t,
            vec![
                up("a", 1),
                up("b", 1),
                up("a", 2),
                del("b"),
                del("c"),
                up("c", 3),
                up("d", 1),
                del("d"),
            ],
        )
        .unwrap();
        assert_eq!(
            shape(&steps),
            [
                ("delete2".into(), 1, vec![3]),
                ("delete1".into(), 1, vec![7]),
                ("upsert2".into(), 1, vec![2]),
            ]
        );
        // b and d deleted (d's upsert folded away); c deleted, then upserted.
        let deleted: Vec<&SqlValue> = steps[0].rows[0].iter().chain(&steps[1].rows[0]).collect();
        assert_eq!(
            deleted,
            [
                &SqlValue::Text("b".into()),
                &SqlValue::Text("c".into()),
                &SqlValue::Text("d".into())
            ]
        );
        assert_eq!(
            steps[2].rows[0],
            vec![
                SqlValue::Text("a".into()),
                SqlValue::Integer(2),
                SqlValue::Text("c".into()),
                SqlValue::Integer(3),
            ]
        );
    }

    #[test]
    fn counts_go_in_whole_statements_then_powers_of_two() {
        let t = target(&["k", "v"], &["k"]);
        let changes: Vec<Change> = (0..1100).map(|i| up(&format!("k{i}"), i)).collect();
        let steps = plan(&t, changes).unwrap();
        // 1100 = 2 × 512 + 64 + 8 + 4
        assert_eq!(
            shape(&steps),
            [
                ("upsert512".into(), 2, vec![0, 512]),
                ("upsert64".into(), 1, vec![1024]),
                ("upsert8".into(), 1, vec![1088]),
                ("upsert4".into(), 1, vec![1096]),
            ]
        );
        assert!(
            steps
                .iter()
                .all(|s| s.rows.iter().all(|r| r.len() == s.sql.matches('$').count()))
        );
    }

    #[test]
    fn nulls_never_fold_and_bad_widths_name_the_change() {
        let t = target(&["k", "v"], &["k"]);
        let null_up = Change::Upsert(vec![SqlValue::Null, SqlValue::Integer(1)]);
        let steps = plan(&t, vec![null_up.clone(), null_up]).unwrap();
        assert_eq!(shape(&steps), [("upsert2".into(), 1, vec![0])]);
        let e = plan(&t, vec![up("a", 1), del("a"), Change::Delete(vec![])]).unwrap_err();
        assert_eq!(e.0, 2);
        assert!(e.1.message.contains("carries 0 values"), "{}", e.1);
    }

    #[test]
    fn keys_of_two_types_in_a_call_go_one_by_one_in_order() {
        let t = target(&["k", "v"], &["k"]);
        let changes = vec![
            Change::Upsert(vec![SqlValue::Integer(1), SqlValue::Integer(1)]),
            Change::Upsert(vec![SqlValue::Integer(2), SqlValue::Integer(1)]),
            Change::Delete(vec![SqlValue::Text("1".into())]),
            Change::Upsert(vec![SqlValue::Integer(1), SqlValue::Integer(2)]),
        ];
        let steps = plan(&t, changes).unwrap();
        assert_eq!(
            shape(&steps),
            [
                ("upsert1".into(), 2, vec![0, 1]),
                ("delete1".into(), 1, vec![2]),
                ("upsert1".into(), 1, vec![3]),
            ]
        );
        // -0.0 and 0.0 fold as one key.
        let zeros = vec![
            Change::Upsert(vec![SqlValue::Real(-0.0), SqlValue::Integer(1)]),
            Change::Upsert(vec![SqlValue::Real(0.0), SqlValue::Integer(2)]),
        ];
        assert_eq!(
            shape(&plan(&t, zeros).unwrap()),
            [("upsert1".into(), 1, vec![1])]
        );
        // Too many columns: refused before any work on them.
        let many: Vec<String> = (0..=MAX_COLUMNS).map(|i| format!("c{i}")).collect();
        assert!(Target::new("t", &many, &many[..1]).is_err());
    }

    #[test]
    fn keys_of_different_types_do_not_collide() {
        let a = key_bytes([SqlValue::Text("1".into())].iter());
        let b = key_bytes([SqlValue::Integer(1)].iter());
        let c = key_bytes([SqlValue::Text("ab".into()), SqlValue::Text("c".into())].iter());
        let d = key_bytes([SqlValue::Text("a".into()), SqlValue::Text("bc".into())].iter());
        assert_ne!(a, b);
        assert_ne!(c, d);
    }
}
