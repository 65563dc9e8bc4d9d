//! The host's SQL capability, for sink stages (`sluice:plugin/sql`).
//!
//! Every call runs inside the host's transaction for the partition range
//! (or part of one) being written; the host commits it together with its
//! progress row, so the effect happens exactly once even for
//! non-idempotent SQL. Never
//! begin, commit or roll back yourself. Placeholders are `$1 … $n`.
//!
//! ```no_run
//! use sluice_guest::sql::{self, Value};
//! # fn f() -> Result<(), sluice_guest::sql::SqlError> {
//! sql::execute("UPDATE counters SET n = n + 1 WHERE name = $1", &[Value::from("seen")])?;
//! let rows = sql::query("SELECT n FROM counters WHERE name = $1", &[Value::from("seen")])?;
//! assert_eq!(rows.columns, vec!["n".to_string()]);
//! # Ok(()) }
//! ```

mod table;
pub(crate) mod types;

use crate::host::host;

pub use table::{Change, Table};
pub use types::{BatchError, Rows, SqlError, Value, not_granted};

/// Check that `name`, the value of setting `what`, is a plain SQL
/// identifier (`[A-Za-z_][A-Za-z0-9_]*`, at most 63 bytes: PostgreSQL's
/// `NAMEDATALEN` − 1), so it can be put into a statement unquoted on both
/// dialects. Returns it.
///
/// # Errors
/// [`crate::Error::Fatal`] naming the setting, the value and the rule, for
/// a stage's `new`.
pub fn identifier<'a>(what: &str, name: &'a str) -> Result<&'a str, crate::Error> {
    let mut chars = name.chars();
    let plain = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.len() <= 63;
    if plain {
        Ok(name)
    } else {
        Err(crate::Error::fatal(format!(
            "{what} `{name}` is not a plain SQL identifier ([A-Za-z_][A-Za-z0-9_]*, at most 63 bytes)"
        )))
    }
}

/// Check `name`, a table or column name of a [`Table`]: a plain
/// identifier ([`identifier`]), which statements write unquoted, or a
/// delimited identifier as [`quoted`] makes it (`"Order Lines"`: inner
/// text of at least one character and no NUL, `"` doubled), for names a
/// plain one cannot write (reserved words, upper case on PostgreSQL,
/// spaces). Returns the name as the database stores it: a plain one in
/// lower case (PostgreSQL folds unquoted names; SQLite compares them
/// without case), a delimited one's inner text (PostgreSQL keeps its
/// first 63 bytes).
///
/// # Errors
/// [`crate::Error::Fatal`] naming `what`, the name and the rule.
pub fn target_name(what: &str, name: &str) -> Result<String, crate::Error> {
    if let Some(inner) = name
        .strip_prefix('"')
        .and_then(|n| n.strip_suffix('"'))
        .filter(|_| name.len() >= 2)
    {
        let stored = inner.replace("\"\"", "\"");
        let doubled_only = !stored.is_empty() && quoted(&stored) == name;
        if doubled_only && !stored.contains('\0') {
            return Ok(stored);
        }
        return Err(crate::Error::fatal(format!(
            "{what} `{name}` is not a delimited SQL identifier (\"…\" around at least one character and no NUL, \" written \"\")"
        )));
    }
    identifier(what, name).map(str::to_ascii_lowercase)
}

/// `name` as a delimited SQL identifier: `"…"`, `"` doubled (both
/// dialects). The database then takes it exactly, case included.
pub fn quoted(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `sqlite` or `postgres`; `None` when no connection is granted.
pub fn dialect() -> Option<String> {
    host().sql_dialect()
}

/// Run one statement; the number of rows changed.
///
/// # Errors
/// The database's error, or [`not_granted`].
pub fn execute(statement: &str, params: &[Value]) -> Result<u64, SqlError> {
    host().sql_execute(statement, params)
}

/// Run one statement once per parameter row, in order, in one host call
/// (`sluice:plugin/sql.execute-batch`, contract 0.2.1); the total number
/// of rows changed. The same effect as [`execute`] for each row, at a
/// fraction of the per-row cost: use it for a chunk of same-shaped
/// inserts, upserts or deletes.
///
/// ```no_run
/// use sluice_guest::sql::{self, Value};
/// # fn f() -> Result<(), sluice_guest::sql::BatchError> {
/// let rows = vec![
///     vec![Value::from("a"), Value::Integer(1)],
///     vec![Value::from("b"), Value::Integer(2)],
/// ];
/// sql::execute_batch("INSERT INTO seen (k, n) VALUES ($1, $2)", &rows)?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// The first failing row's index and error; the host stops at it. A
/// refused statement or [`not_granted`] is reported for row 0.
pub fn execute_batch<R: AsRef<[Value]>>(statement: &str, rows: &[R]) -> Result<u64, BatchError> {
    let rows: Vec<&[Value]> = rows.iter().map(AsRef::as_ref).collect();
    host().sql_execute_batch(statement, &rows)
}

/// Run one query.
///
/// # Errors
/// The database's error, or [`not_granted`].
pub fn query(statement: &str, params: &[Value]) -> Result<Rows, SqlError> {
    host().sql_query(statement, params)
}
