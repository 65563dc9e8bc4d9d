//! The SQL capability: one database connection owned by the host, shared
//! between the sink driver (which brackets each partition range in a
//! transaction with its progress row) and the plugin's `sql` imports (which
//! run inside that transaction).
//!
//! Backends: SQLite through rusqlite with the bundled library
//! (`sqlite:PATH`), PostgreSQL through the `postgres` client
//! (`postgres://…`). Placeholders are `$1 … $n` on both: on SQLite the
//! host writes them as numbered `?n` before the statement is prepared,
//! PostgreSQL takes them natively.
//!
//! Files: this one holds the shared types ([`SqlValue`], [`DbError`],
//! [`Dialect`], the [`Backend`] trait); `url` the URL handling
//! ([`connect`], [`redact`], [`sink_identity`]), `session` the session the
//! driver and plugins share ([`SqlGrant`]), `ddl` creating the host's
//! tables and adding columns; `sqlite` and `postgres` are
//! the backends, `bulk` the statements of a plugin's `apply` (a table's
//! changes folded and sent as multi-row statements), `guard`
//! the checks on plugin statements before they run, `role` the plugin
//! role's check on PostgreSQL, `dry` the backend of `host test`'s dry run
//! (no database).

#[cfg(test)]
use std::path::Path;

pub mod bulk;
mod ddl;
mod dry;
mod guard;
pub mod password;
mod postgres;
mod role;
mod session;
mod sqlite;
mod url;

/// A parameter or column value (the WIT `sql.value`).
#[derive(Debug, Clone, PartialEq)]
pub enum SqlValue {
    /// NULL.
    Null,
    /// 64-bit integer.
    Integer(i64),
    /// Double.
    Real(f64),
    /// Text.
    Text(String),
    /// Bytes.
    Blob(Vec<u8>),
}

/// A database error (the WIT `sql.sql-error`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} ({code})")]
pub struct DbError {
    /// The database's message.
    pub message: String,
    /// SQLSTATE (PostgreSQL), extended result code name (SQLite), or
    /// `sluice` for refusals by the host.
    pub code: String,
}

impl DbError {
    /// A failure that may pass on its own, so the rolled-back part may be
    /// tried again: connection problems (SQLSTATE class 08),
    /// serialization failures and deadlocks (class 40), a busy SQLite
    /// database, and PostgreSQL's race between two sessions running the
    /// same `CREATE TABLE IF NOT EXISTS` (42P07, or a unique violation on
    /// its own catalog): members of a pipeline group run their sinks'
    /// `init` at the same moment.
    pub fn is_transient(&self) -> bool {
        self.is_connection_lost() || self.is_contention() || self.is_concurrent_create()
    }

    /// Another session is in the way and will move on: a serialization
    /// failure or deadlock (SQLSTATE class 40), a lock not granted within
    /// `lock_timeout` (55P03: a row another pipeline group member's open
    /// part holds, possibly a member frozen until PostgreSQL ends its
    /// session), a busy SQLite database, or another session's `CREATE
    /// TABLE IF NOT EXISTS` of the same table at the same moment
    /// ([`DbError::is_concurrent_create`]: a plugin's `init` on several
    /// `--sink-connections` or group members). Nothing was applied; the
    /// same work may be done again after a pause.
    pub fn is_contention(&self) -> bool {
        self.code.starts_with("40")
            || self.code == "55P03"
            || self.code == "SQLITE_BUSY"
            || self.is_concurrent_create()
    }

    /// The server has no connection slot free (53300, `too many clients
    /// already`): after a failover every client reconnects at once, so a
    /// reconnect keeps trying (`--sink-retry-for`).
    pub fn is_server_full(&self) -> bool {
        self.code == "53300"
    }

    /// PostgreSQL's answer to two sessions running the same `CREATE TABLE
    /// IF NOT EXISTS` at once: "already exists" (42P07), the table's row
    /// type already there (42710 `type "…" already exists`: seen when two
    /// group members started together), or a unique violation (23505) on
    /// its own catalog. The other session made it.
    pub fn is_concurrent_create(&self) -> bool {
        self.code == "42P07"
            || (self.code == "42710" && self.message.starts_with("type "))
            || (self.code == "23505"
                && (self.message.contains("pg_type_typname_nsp_index")
                    || self.message.contains("pg_class_relname_nsp_index")))
    }

    /// The table does not exist (PostgreSQL 42P01, SQLite "no such
    /// table"): a database an older host made, or none at all.
    pub fn is_missing_table(&self) -> bool {
        self.code == "42P01" || self.message.contains("no such table")
    }

    /// The connection is gone (SQLSTATE class 08; 57P01–57P03: the server
    /// shut down, crashed or is starting; 25P03 and 57P05: the server
    /// ended a session left idle, in a transaction or not, past its
    /// timeout, say a host that was frozen): only a new connection helps
    /// ([`SqlGrant::reconnect`]).
    pub fn is_connection_lost(&self) -> bool {
        self.code.starts_with("08")
            || matches!(
                self.code.as_str(),
                "57P01" | "57P02" | "57P03" | "57P05" | "25P03"
            )
    }

    fn host(message: impl Into<String>) -> Self {
        DbError {
            message: message.into(),
            code: "sluice".into(),
        }
    }
}

/// How long a lost sink database connection is reconnected before the
/// job stops (`--sink-retry-for`): 300 s.
pub const DEFAULT_RECONNECT_FOR: std::time::Duration = std::time::Duration::from_secs(300);

/// Most rows one query returns (a plugin's query results are collected
/// in host memory, outside the plugin's memory cap).
pub const QUERY_ROWS: usize = 100_000;
/// Most bytes of values one query returns.
pub const QUERY_BYTES: usize = 64 << 20;

/// The refusal when a query passes [`QUERY_ROWS`] or [`QUERY_BYTES`].
pub(crate) fn too_large(rows: usize, bytes: usize) -> DbError {
    DbError::host(format!(
        "the query returned more than {QUERY_ROWS} rows or {} MiB ({rows} rows, {bytes} bytes so far): narrow it (WHERE, LIMIT)",
        QUERY_BYTES >> 20
    ))
}

/// Counts a query's rows and bytes against the caps.
#[derive(Default)]
pub(crate) struct RowBudget {
    rows: usize,
    bytes: usize,
}

impl RowBudget {
    /// Take one more row of `bytes`.
    ///
    /// # Errors
    /// [`too_large`] past a cap.
    pub(crate) fn take(&mut self, bytes: usize) -> Result<(), DbError> {
        self.rows += 1;
        self.bytes += bytes;
        if self.rows > QUERY_ROWS || self.bytes > QUERY_BYTES {
            return Err(too_large(self.rows, self.bytes));
        }
        Ok(())
    }
}

impl SqlValue {
    /// Bytes it holds (8 for numbers), for [`RowBudget`].
    pub(crate) fn size(&self) -> usize {
        match self {
            SqlValue::Null => 1,
            SqlValue::Integer(_) | SqlValue::Real(_) => 8,
            SqlValue::Text(t) => t.len(),
            SqlValue::Blob(b) => b.len(),
        }
    }
}

/// A plugin statement as it ran, kept while a session records
/// ([`SqlGrant::record`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Ran {
    /// The statement's text.
    pub sql: String,
    /// Its parameters, `$1` first.
    pub params: Vec<SqlValue>,
    /// A query (`sql.query`) rather than a statement (`sql.execute`).
    pub query: bool,
    /// Rows changed (a statement) or returned (a query), or the error;
    /// `Ok(None)` on a session without a database ([`SqlGrant::dry`]).
    pub outcome: Result<Option<u64>, DbError>,
}

/// Rows of a query.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct QueryRows {
    /// Column names.
    pub columns: Vec<String>,
    /// Values, one per column.
    pub rows: Vec<Vec<SqlValue>>,
}

/// Which SQL a backend speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// SQLite (rusqlite, bundled).
    Sqlite,
    /// PostgreSQL (the `postgres` crate).
    Postgres,
}

impl Dialect {
    /// `sqlite` or `postgres`: what the WIT `sql.dialect` call returns.
    pub fn name(self) -> &'static str {
        match self {
            Dialect::Sqlite => "sqlite",
            Dialect::Postgres => "postgres",
        }
    }
}

/// The operations a backend offers.
pub trait Backend: Send {
    /// The SQL it speaks.
    fn dialect(&self) -> Dialect;
    /// Run statements without parameters (transaction control, DDL).
    ///
    /// # Errors
    /// The database's error.
    fn batch(&mut self, sql: &str) -> Result<(), DbError>;
    /// Run one statement; rows changed.
    ///
    /// # Errors
    /// The database's error.
    fn execute(&mut self, sql: &str, params: &[SqlValue]) -> Result<u64, DbError>;
    /// Run one statement once per parameter row, in order; rows changed
    /// by each. The default calls [`Backend::execute`] per row; PostgreSQL
    /// pipelines the rows (all sent before the first answer is read).
    ///
    /// # Errors
    /// The index of the first row that failed and its error; no later
    /// row has an effect (the default stops there, and on PostgreSQL the
    /// failed transaction refuses the rest).
    fn execute_many(
        &mut self,
        sql: &str,
        rows: &[Vec<SqlValue>],
    ) -> Result<Vec<u64>, (usize, DbError)> {
        rows.iter()
            .enumerate()
            .map(|(i, params)| self.execute(sql, params).map_err(|e| (i, e)))
            .collect()
    }
    /// Run one query.
    ///
    /// # Errors
    /// The database's error.
    fn query(&mut self, sql: &str, params: &[SqlValue]) -> Result<QueryRows, DbError>;
    /// Load `rows` into `table`'s `columns` (one value per column) with
    /// binary `COPY … FROM STDIN`, each value encoded for its column's
    /// type as [`Backend::execute`] binds it to a parameter of that type,
    /// except in a `text` column that stands in for another type
    /// (`stand_in[i]` names it): there the value's text form, as a
    /// parameter of that type takes it. Rows loaded. Only PostgreSQL has
    /// it (the default refuses).
    ///
    /// # Errors
    /// The index of the row whose value could not be encoded or that the
    /// server names in its error's context (`COPY …, line N`; else 0), and
    /// the error; nothing is loaded.
    fn copy_in(
        &mut self,
        table: &str,
        columns: &[String],
        stand_in: &[Option<String>],
        rows: &[Vec<SqlValue>],
    ) -> Result<u64, (usize, DbError)> {
        let _ = (table, columns, stand_in, rows);
        Err((0, DbError::host("this database has no COPY")))
    }
    /// False when a transaction is open (SQLite tells; PostgreSQL does not,
    /// so it answers `None`).
    fn in_autocommit(&self) -> Option<bool>;
    /// DDL type for byte strings.
    fn blob_type(&self) -> &'static str;
    /// Mark the statements that follow as a plugin's (`true`) or the
    /// host's own (`false`). A backend with its own access control
    /// (SQLite's authorizer) applies the plugin rules only in between;
    /// the default does nothing.
    fn set_untrusted(&mut self, _on: bool) {}
    /// Open the plugin's window inside the host's transaction: bound each
    /// plugin statement to `limit` and, on PostgreSQL, run them as `role`
    /// (`SET LOCAL ROLE`, see [`SqlGrant::plugin_role`]).
    ///
    /// # Errors
    /// The database's error.
    fn enter_plugin_window(
        &mut self,
        limit: Option<std::time::Duration>,
        role: Option<&str>,
    ) -> Result<(), DbError>;
    /// Back to the host's own statements: no time bound, the session's
    /// own role.
    ///
    /// # Errors
    /// The database's error.
    fn leave_plugin_window(&mut self) -> Result<(), DbError>;
    /// What identifies the open transaction and who runs in it
    /// (PostgreSQL: the transaction id and `current_user`), compared before
    /// and after plugin statements; `None` where the backend tells it
    /// otherwise ([`Backend::in_autocommit`] on SQLite).
    ///
    /// # Errors
    /// The database's error.
    fn transaction_mark(&mut self) -> Result<Option<String>, DbError> {
        Ok(None)
    }
    /// Why the backend's access control refused the last plugin
    /// statement, if it did (taken: a second call answers `None`).
    fn take_denial(&mut self) -> Option<String> {
        None
    }
}

pub use ddl::{add_column, create_tables};
pub use session::{Session, SqlGrant};
pub use url::{
    check_url, connect, connect_with, is_postgres_url, redact, sink_identity, sink_identity_in,
};

/// For unit tests of the modules above that run on real databases: a
/// SQLite file `file` in `dir` always, and a fresh PostgreSQL database too
/// when the suite's server is up (`SLUICE_TEST_PG_URL`, set by
/// scripts/test.sh).
#[cfg(test)]
pub(crate) fn test_databases(dir: &Path, file: &str) -> Vec<String> {
    let mut urls = vec![format!("sqlite:{}", dir.join(file).display())];
    if let Ok(admin) = std::env::var("SLUICE_TEST_PG_URL") {
        static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let name = format!(
            "sluice_unit_{}_{}",
            std::process::id(),
            SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let mut b = connect(&admin).unwrap();
        b.batch(&format!("DROP DATABASE IF EXISTS {name}")).unwrap();
        b.batch(&format!("CREATE DATABASE {name}")).unwrap();
        let base = admin.rsplit_once('/').map(|(b, _)| b).unwrap();
        urls.push(format!("{base}/{name}"));
    }
    urls
}

#[cfg(test)]
mod apply_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod versioned_tests;
