//! The SQL capability's values (the WIT `sql.value`, `sql.rows`,
//! `sql.sql-error`, a table's `change`), shared by the public calls in [`super`] and the host
//! imports behind them.

use std::fmt;

/// One change of a [`super::Table`]'s row.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// Insert the row, or replace the row with its key: one value per
    /// column, in the order given to [`super::Table::new`].
    Upsert(Vec<Value>),
    /// Delete the row with this key: one value per key column, in the
    /// order given to [`super::Table::new`]; for [`super::Table::apply_versioned`],
    /// then the delete's version.
    Delete(Vec<Value>),
}

/// A parameter or column value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// SQL NULL.
    Null,
    /// A 64-bit integer.
    Integer(i64),
    /// A double.
    Real(f64),
    /// Text.
    Text(String),
    /// Bytes.
    Blob(Vec<u8>),
}

impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::Integer(v)
    }
}

impl From<i32> for Value {
    fn from(v: i32) -> Self {
        Value::Integer(i64::from(v))
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Value::Real(v)
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Text(v.to_string())
    }
}

impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::Text(v)
    }
}

impl From<&[u8]> for Value {
    fn from(v: &[u8]) -> Self {
        Value::Blob(v.to_vec())
    }
}

impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Self {
        v.map_or(Value::Null, Into::into)
    }
}

/// A database error: the database's message and code (SQLSTATE for
/// PostgreSQL, the extended result code name for SQLite).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqlError {
    /// The database's message.
    pub message: String,
    /// SQLSTATE, SQLite code name, or `sluice` for host-side refusals.
    pub code: String,
}

impl fmt::Display for SqlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message, self.code)
    }
}

impl std::error::Error for SqlError {}

impl From<SqlError> for crate::Error {
    /// A SQL error is fatal for the range: the host rolls the transaction
    /// back in any case.
    fn from(e: SqlError) -> Self {
        crate::Error::Fatal(format!("sql: {e}"))
    }
}

/// Why [`super::execute_batch`] stopped: the parameter row that failed
/// (0 when the statement itself was refused) and its error. The rows
/// before it ran, but the host rolls the range back in any case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchError {
    /// Index of the failing row in the `rows` passed.
    pub row: usize,
    /// The error, as [`super::execute`] would return it for that row.
    pub error: SqlError,
}

impl fmt::Display for BatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "row {}: {}", self.row, self.error)
    }
}

impl std::error::Error for BatchError {}

impl From<BatchError> for crate::Error {
    /// Fatal for the range, like a [`SqlError`].
    fn from(e: BatchError) -> Self {
        crate::Error::Fatal(format!("sql: {e}"))
    }
}

/// Rows returned by [`super::query`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Rows {
    /// Column names.
    pub columns: Vec<String>,
    /// Row values, one per column.
    pub rows: Vec<Vec<Value>>,
}

/// The error returned where no SQL connection was granted.
pub fn not_granted() -> SqlError {
    SqlError {
        message: "no sql capability granted (configure the pipeline with --sink-db)".into(),
        code: "sluice".into(),
    }
}
