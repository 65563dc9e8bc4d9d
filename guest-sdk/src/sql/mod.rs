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

pub(crate) mod types;

use crate::host::host;

pub use types::{Rows, SqlError, Value, not_granted};

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

/// Run one query.
///
/// # Errors
/// The database's error, or [`not_granted`].
pub fn query(statement: &str, params: &[Value]) -> Result<Rows, SqlError> {
    host().sql_query(statement, params)
}
