//! [`Table`]: a table kept current by upserts and deletes, through the
//! host's bulk path (`sluice:plugin/sql.apply`, contract 0.2.2, and
//! `sql.apply-versioned`, 0.2.3).
//!
//! The host folds the changes to each key's last one and sends them as
//! multi-row statements of up to 512 rows, the portable `INSERT … ON
//! CONFLICT (key) DO UPDATE SET c = excluded.c` (SQLite 3.24+, PostgreSQL
//! 9.5+) and `DELETE … WHERE key IN (…)`, or on PostgreSQL, from 256 rows
//! on, by `COPY` into a temporary table and two merge statements:
//! PostgreSQL spends its time per statement, so one-row statements kept a
//! server core busy at a third of the rate (docs/benchmarks.md, sessions
//! 24 and 25).

use super::target_name;
pub use super::types::Change;
use super::types::{BatchError, Value};
use crate::host::host;

/// A table that a sink keeps current from a stream of upserts and
/// deletes (a row per primary key), written through the host's bulk path.
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
    name: String,
    columns: Vec<String>,
    key: Vec<String>,
}

impl Table {
    /// A table `name` with `columns`, whose primary key (or a unique
    /// constraint) is `key`, a non-empty subset of `columns`. The table
    /// must exist when [`Table::apply`] runs (create it in `Sink::init`).
    /// Names are plain identifiers, written unquoted, or delimited ones
    /// (`"Order"`, made by [`super::quoted`]) for the names a plain one
    /// cannot write ([`target_name`]).
    ///
    /// # Errors
    /// [`crate::Error::Fatal`] for a name that is neither
    /// ([`target_name`]), no columns, a name given twice, or a key column
    /// that is not one of the columns.
    pub fn new(name: &str, columns: &[&str], key: &[&str]) -> Result<Table, crate::Error> {
        target_name("table", name)?;
        let stored = |names: &[&str]| {
            names
                .iter()
                .map(|c| target_name("column", c))
                .collect::<Result<Vec<String>, _>>()
        };
        let (stored_columns, stored_key) = (stored(columns)?, stored(key)?);
        let repeated = |names: &[String]| {
            names
                .iter()
                .enumerate()
                .any(|(i, n)| names[..i].contains(n))
        };
        if columns.is_empty()
            || key.is_empty()
            || repeated(&stored_columns)
            || repeated(&stored_key)
        {
            return Err(crate::Error::fatal(format!(
                "table {name}: needs at least one column and one key column, each named once"
            )));
        }
        if let Some((k, _)) = key
            .iter()
            .zip(&stored_key)
            .find(|(_, s)| !stored_columns.contains(s))
        {
            return Err(crate::Error::fatal(format!(
                "table {name}: key column {k} is not a column"
            )));
        }
        let owned = |names: &[&str]| names.iter().map(|n| n.to_string()).collect();
        Ok(Table {
            name: name.to_string(),
            columns: owned(columns),
            key: owned(key),
        })
    }

    /// Apply `changes` so that each row ends as if they had been applied
    /// one by one, in one host call (`sql.apply`). The host keeps each
    /// key's last change (an upsert replaces the row's listed columns; a
    /// delete earlier in the call is kept, so unlisted columns return to
    /// their defaults as they would one by one) and sends the deletes,
    /// then the upserts, as multi-row statements. Returns the rows the
    /// statements changed; triggers see only those statements.
    ///
    /// Keys are folded by their exact values: give each key column its
    /// values in one type (a text key always as [`Value`]`::Text`); a call
    /// whose key column gets two types (integer 1 and text "1") runs
    /// change by change, in order. Keys the database takes as equal but
    /// that differ here in one type (a case-insensitive collation,
    /// `char(n)` padding) may meet in one statement, which PostgreSQL
    /// refuses (SQLSTATE 21000) and SQLite applies as the later one. A
    /// key with a NULL is never folded. Rows of different keys reach the
    /// table deletes first, then each key at its last change, which a
    /// second unique constraint of the table can notice.
    ///
    /// [`Value`]: super::Value
    ///
    /// # Errors
    /// A [`BatchError`] whose `row` is the index in `changes` of the
    /// change the failing statement carried (its first, for a multi-row
    /// one), with the database's error; a change with the wrong number of
    /// values fails before anything is sent. The host rolls the part back
    /// in either case.
    pub fn apply(&self, changes: Vec<Change>) -> Result<u64, BatchError> {
        if changes.is_empty() {
            return Ok(0);
        }
        host().sql_apply(&self.name, &self.columns, &self.key, None, changes)
    }

    /// [`Table::apply`] with a version guard (`sql.apply-versioned`,
    /// contract 0.2.3): last writer wins by version, as a change-data-capture
    /// sink needs. Each row keeps in `version_column` (one of the columns,
    /// not a key column) the version of the last change applied to it; a
    /// change applies only where the stored version is NULL or lies in
    /// [`low`, the change's version] as the database compares them (equal
    /// versions apply; [`Value::Null`] for `low`: no lower bound). An
    /// upsert's version is its value for `version_column`; a
    /// [`Change::Delete`] carries the key's values, then its version.
    /// Changes the guard holds back change nothing and are not counted in
    /// the result: fewer rows changed than changes given means some were
    /// held back (or deleted keys had no row); query the stored versions
    /// to learn which. Each key's changes fold to the last one given, as
    /// in [`Table::apply`]: give a key's changes in version order.
    ///
    /// [`Value::Null`]: super::Value::Null
    ///
    /// # Errors
    /// As [`Table::apply`]; also when `version_column` is not one of the
    /// columns or is a key column (`row` 0).
    pub fn apply_versioned(
        &self,
        version_column: &str,
        low: Value,
        changes: Vec<Change>,
    ) -> Result<u64, BatchError> {
        if changes.is_empty() {
            return Ok(0);
        }
        host().sql_apply(
            &self.name,
            &self.columns,
            &self.key,
            Some((version_column, low)),
            changes,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_when_the_table_is_made() {
        assert!(Table::new("t", &["k", "v"], &["k"]).is_ok());
        assert!(Table::new("t; drop", &["k"], &["k"]).is_err());
        assert!(Table::new("t", &["k"], &["x"]).is_err());
        assert!(Table::new("t", &["k", "k"], &["k"]).is_err());
        assert!(Table::new("t", &[], &[]).is_err());
        // Delimited names: as the database stores them, so "k" is k.
        assert!(Table::new("\"Order\"", &["\"Key\"", "\"a \"\"b\"\"\""], &["\"Key\""]).is_ok());
        assert!(Table::new("t", &["k", "\"k\""], &["k"]).is_err());
        assert!(Table::new("t", &["\"k\"", "v"], &["K"]).is_ok());
        for bad in ["\"\"", "\"a\"b\"", "\"a\0b\"", "\"", "\"a"] {
            assert!(Table::new(bad, &["k"], &["k"]).is_err(), "{bad}");
        }
        assert_eq!(super::super::quoted("a\"b"), "\"a\"\"b\"");
        let e = Table::new("t", &["k"], &["x"]).unwrap_err();
        assert!(
            e.to_string().contains("key column x is not a column"),
            "{e}"
        );
    }

    #[test]
    fn natively_apply_says_no_connection_is_granted() {
        let t = Table::new("t", &["k"], &["k"]).unwrap();
        assert_eq!(t.apply(Vec::new()), Ok(0));
        let e = t
            .apply(vec![Change::Delete(vec![super::super::Value::from("a")])])
            .unwrap_err();
        assert_eq!((e.row, e.error.code.as_str()), (0, "sluice"));
    }
}
