//! The SQL capability: one database connection owned by the host, shared
//! between the sink driver (which brackets each partition range in a
//! transaction with its progress row) and the plugin's `sql` imports (which
//! run inside that transaction).
//!
//! Backends: SQLite through rusqlite with the bundled library
//! (`sqlite:PATH`), PostgreSQL through the `postgres` client
//! (`postgres://…`). Placeholders are `$1 … $n` on both: SQLite binds them
//! by name (`$1` is a named parameter there), PostgreSQL natively.
//!
//! Files: this one holds the shared types ([`SqlValue`], [`DbError`],
//! [`Dialect`], the [`Backend`] trait), URL handling ([`connect`],
//! [`redact`], [`sink_identity`]) and the session the driver and plugins
//! share ([`SqlGrant`]); `sqlite` and `postgres` are the backends, `guard`
//! the text checks on plugin statements.

use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

mod guard;
pub mod password;
mod postgres;
mod sqlite;

use self::guard::{HOST_TABLES, REFUSED, REFUSED_ALTER, first_keywords};
use self::postgres::Postgres;
use self::sqlite::Sqlite;

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
    /// database.
    pub fn is_transient(&self) -> bool {
        self.is_connection_lost() || self.code.starts_with("40") || self.code == "SQLITE_BUSY"
    }

    /// The connection is gone (SQLSTATE class 08, and 57P01–57P03: the
    /// server shut down, crashed or is starting): only a new connection
    /// helps ([`SqlGrant::reconnect`]).
    pub fn is_connection_lost(&self) -> bool {
        self.code.starts_with("08") || matches!(self.code.as_str(), "57P01" | "57P02" | "57P03")
    }

    fn host(message: impl Into<String>) -> Self {
        DbError {
            message: message.into(),
            code: "sluice".into(),
        }
    }
}

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
    /// Run one query.
    ///
    /// # Errors
    /// The database's error.
    fn query(&mut self, sql: &str, params: &[SqlValue]) -> Result<QueryRows, DbError>;
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
    /// Bound each plugin statement that follows to `limit` (`None`: the
    /// host's own statements again, unbounded).
    ///
    /// # Errors
    /// The database's error.
    fn statement_limit(&mut self, limit: Option<std::time::Duration>) -> Result<(), DbError>;
    /// Why the backend's access control refused the last plugin
    /// statement, if it did (taken: a second call answers `None`).
    fn take_denial(&mut self) -> Option<String> {
        None
    }
}

// ---------------------------------------------------------------- session

/// `url` with its passwords replaced by `***`, for messages, logs and the
/// checkpoint: the user-info password (`scheme://user:PASSWORD@…`), query
/// parameters whose name holds `password` (`?password=…`,
/// `sslpassword=…`), and the same keys in libpq's `key=value` form.
pub fn redact(url: &str) -> String {
    let secret = |k: &str| k.to_ascii_lowercase().contains("password");
    let Some((scheme, rest)) = url.split_once("://") else {
        // libpq's key=value form (`host=db password=x`), or sqlite:PATH.
        if !url.contains('=') || url.starts_with("sqlite:") {
            return url.to_string();
        }
        return url
            .split(' ')
            .map(|w| match w.split_once('=') {
                Some((k, _)) if secret(k) => format!("{k}=***"),
                _ => w.to_string(),
            })
            .collect::<Vec<_>>()
            .join(" ");
    };
    // The user-info ends at the last `@`, unless that one is in the query
    // (`?user=a@b`); a password may hold `?` or `/` unencoded.
    let at = rest.rfind('@').and_then(|at| match rest[..at].find('?') {
        Some(q) if rest[q..at].contains('=') => rest[..q].rfind('@'),
        _ => Some(at),
    });
    let (userinfo, rest) = match at {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    };
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    let mut out = match userinfo {
        Some(u) => match u.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{rest}"),
            None => format!("{scheme}://{u}@{rest}"),
        },
        None => format!("{scheme}://{rest}"),
    };
    if let Some(q) = query {
        let params: Vec<String> = q
            .split('&')
            .map(|p| match p.split_once('=') {
                Some((k, _)) if secret(k) => format!("{k}=***"),
                _ => p.to_string(),
            })
            .collect();
        out.push('?');
        out.push_str(&params.join("&"));
    }
    out
}

/// How the checkpoint records a `--sink-db` URL: [`redact`]ed, and for
/// SQLite with an absolute path, so that a later command run from another
/// directory names the same file.
///
/// # Errors
/// The current directory cannot be read.
pub fn sink_identity(url: &str) -> std::io::Result<String> {
    match url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
    {
        Some(path) if !path.is_empty() && path != ":memory:" => {
            let p = std::path::Path::new(path);
            let abs = if p.is_absolute() {
                p.to_path_buf()
            } else {
                std::env::current_dir()?.join(p)
            };
            Ok(format!("sqlite:{}", abs.display()))
        }
        _ => Ok(redact(url)),
    }
}

/// Open a backend from a `--sink-db` URL: `sqlite:PATH` (also
/// `sqlite://PATH`) or `postgres://…` / `postgresql://…`.
///
/// # Errors
/// An unknown scheme, or the database's connection error.
pub fn connect(url: &str) -> Result<Box<dyn Backend>, DbError> {
    connect_with(url, None)
}

/// [`connect`], with a PostgreSQL password read from `password_file`
/// when the URL has none (see `password`).
///
/// # Errors
/// As [`connect`]; the password file cannot be read.
pub fn connect_with(url: &str, password_file: Option<&Path>) -> Result<Box<dyn Backend>, DbError> {
    if let Some(path) = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
    {
        if path.is_empty() {
            return Err(DbError::host("sqlite: needs a path, e.g. sqlite:./sink.db"));
        }
        return Ok(Box::new(Sqlite::open(path)?));
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Ok(Box::new(Postgres::connect(url, password_file)?));
    }
    Err(DbError::host(format!(
        "unsupported --sink-db `{}`: use sqlite:PATH or postgres://USER@HOST:PORT/DB",
        redact(url)
    )))
}

/// State behind the capability: the connection and the transaction the
/// driver has open for the current partition range.
pub struct Session {
    backend: Box<dyn Backend>,
    /// How long one plugin statement may run ([`SqlGrant::limit_statements`]).
    statement_limit: Option<std::time::Duration>,
    /// How to open the connection again (`--sink-db`, password file).
    origin: Option<(String, Option<std::path::PathBuf>)>,
    /// A transaction is open for plugin calls.
    open: bool,
    /// The first SQL error of the current transaction: it is rolled back
    /// whatever the plugin does next.
    failed: Option<DbError>,
    /// Statement texts that passed the guard (the verdict depends on the
    /// text only), so a sink's per-record statements are checked once.
    approved: std::collections::HashSet<String>,
}

/// Most distinct statement texts remembered in [`Session::approved`].
const APPROVED_CAP: usize = 256;
/// Longest statement text remembered, bytes (longer ones are checked every
/// time), so the cache holds at most `APPROVED_CAP × APPROVED_MAX_LEN`
/// bytes whatever a plugin sends.
const APPROVED_MAX_LEN: usize = 4096;

/// A shared handle on a [`Session`]: what a sink instance is granted.
#[derive(Clone)]
pub struct SqlGrant(Arc<Mutex<Session>>);

impl std::fmt::Debug for SqlGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SqlGrant")
    }
}

impl SqlGrant {
    /// Wrap a backend.
    pub fn new(backend: Box<dyn Backend>) -> Self {
        SqlGrant(Arc::new(Mutex::new(Session {
            backend,
            statement_limit: None,
            origin: None,
            open: false,
            failed: None,
            approved: std::collections::HashSet::new(),
        })))
    }

    /// Connect from a `--sink-db` URL.
    ///
    /// # Errors
    /// As [`connect`].
    pub fn connect(url: &str) -> Result<Self, DbError> {
        Self::connect_with(url, None)
    }

    /// Connect as [`connect_with`].
    ///
    /// # Errors
    /// As [`connect_with`].
    pub fn connect_with(url: &str, password_file: Option<&Path>) -> Result<Self, DbError> {
        let g = connect_with(url, password_file).map(Self::new)?;
        g.lock().origin = Some((url.to_string(), password_file.map(Path::to_path_buf)));
        Ok(g)
    }

    /// Bound every plugin statement to `limit` (the plugin call deadline):
    /// PostgreSQL's `statement_timeout` (SQLSTATE 57014 when it fires),
    /// SQLite's progress handler (the statement is interrupted).
    pub fn limit_statements(&self, limit: std::time::Duration) {
        self.lock().statement_limit = Some(limit);
    }

    /// Replace a lost connection with a new one to the same database
    /// (plugins and the driver share the session, so all of them use the
    /// new one). Nothing of the transaction that was open survives: the
    /// caller re-applies its part from the progress row.
    ///
    /// # Errors
    /// The connection error; a session made from a backend rather than a
    /// URL cannot reconnect.
    pub fn reconnect(&self) -> Result<(), DbError> {
        let origin = self.lock().origin.clone();
        let Some((url, password_file)) = origin else {
            return Err(DbError::host(
                "this session cannot reconnect (it was not opened from a URL)",
            ));
        };
        let backend = connect_with(&url, password_file.as_deref())?;
        let mut s = self.lock();
        s.backend = backend;
        s.open = false;
        s.failed = None;
        Ok(())
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Session> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The dialect.
    pub fn dialect(&self) -> Dialect {
        self.lock().backend.dialect()
    }

    /// A plugin's `execute`.
    ///
    /// # Errors
    /// The database's error or a host refusal; either aborts the range.
    pub fn plugin_execute(&self, sql: &str, params: &[SqlValue]) -> Result<u64, DbError> {
        let mut s = self.lock();
        s.guarded(sql, |b| b.execute(sql, params))
    }

    /// A plugin's `query`.
    ///
    /// # Errors
    /// As [`SqlGrant::plugin_execute`].
    pub fn plugin_query(&self, sql: &str, params: &[SqlValue]) -> Result<QueryRows, DbError> {
        let mut s = self.lock();
        s.guarded(sql, |b| b.query(sql, params))
    }
}

/// A backend in plugin mode ([`Backend::set_untrusted`]) until dropped,
/// also when the plugin statement's call panics.
struct Untrusted<'a>(&'a mut dyn Backend);

impl<'a> Untrusted<'a> {
    fn new(backend: &'a mut dyn Backend) -> Self {
        backend.set_untrusted(true);
        Untrusted(backend)
    }

    fn backend(&mut self) -> &mut dyn Backend {
        &mut *self.0
    }
}

impl Drop for Untrusted<'_> {
    fn drop(&mut self) {
        self.0.set_untrusted(false);
    }
}

impl Session {
    fn guarded<T>(
        &mut self,
        sql: &str,
        f: impl FnOnce(&mut dyn Backend) -> Result<T, DbError>,
    ) -> Result<T, DbError> {
        if !self.open {
            return Err(DbError::host(
                "sql is only available inside sink open/write/close of a partition range",
            ));
        }
        if let Some(e) = &self.failed {
            return Err(DbError {
                message: format!("transaction already failed: {}", e.message),
                code: e.code.clone(),
            });
        }
        if !self.approved.contains(sql) {
            self.check(sql)?;
            if sql.len() <= APPROVED_MAX_LEN {
                if self.approved.len() >= APPROVED_CAP {
                    self.approved.clear();
                }
                self.approved.insert(sql.to_string());
            }
        }
        let r = {
            let mut untrusted = Untrusted::new(self.backend.as_mut());
            f(untrusted.backend())
        };
        let denial = self.backend.take_denial();
        let r = r.map_err(|e| denial.map_or(e, DbError::host));
        if let Err(e) = &r {
            self.failed = Some(e.clone());
        } else if self.backend.in_autocommit() == Some(true) {
            let e = DbError::host("the statement ended the host's transaction");
            self.failed = Some(e.clone());
            return Err(e);
        }
        r
    }

    /// Refuse transaction control, escapes from the granted database and
    /// (on PostgreSQL; SQLite's authorizer does it there) the host's own
    /// tables, by the statement's text; a refusal fails the transaction.
    fn check(&mut self, sql: &str) -> Result<(), DbError> {
        let postgres = self.backend.dialect() == Dialect::Postgres;
        let (kw, second) = first_keywords(sql, postgres);
        if postgres && kw == "ALTER" && REFUSED_ALTER.contains(&second.as_str()) {
            let e = DbError::host(format!(
                "`ALTER {second}` statements are not allowed: they change settings beyond the host's transaction"
            ));
            self.failed = Some(e.clone());
            return Err(e);
        }
        if REFUSED.contains(&kw.as_str()) {
            let e = DbError::host(format!(
                "`{kw}` statements are not allowed: the host owns the transaction and the connection"
            ));
            self.failed = Some(e.clone());
            return Err(e);
        }
        if self.backend.dialect() == Dialect::Sqlite {
            return Ok(());
        }
        let lower = sql.to_ascii_lowercase();
        if lower.contains("u&\"") {
            let e = DbError::host(
                "Unicode-escaped identifiers (U&\"…\") are not allowed: the host checks table names by their text",
            );
            self.failed = Some(e.clone());
            return Err(e);
        }
        if let Some(t) = HOST_TABLES.iter().find(|t| lower.contains(*t)) {
            let e = DbError::host(format!(
                "table {t} belongs to the host; plugins may not use it"
            ));
            self.failed = Some(e.clone());
            return Err(e);
        }
        Ok(())
    }

    pub(crate) fn backend(&mut self) -> &mut dyn Backend {
        self.backend.as_mut()
    }

    pub(crate) fn begin(&mut self) -> Result<(), DbError> {
        let sql = match self.backend.dialect() {
            Dialect::Sqlite => "BEGIN IMMEDIATE",
            Dialect::Postgres => "BEGIN ISOLATION LEVEL READ COMMITTED",
        };
        self.backend.batch(sql)?;
        if let Some(limit) = self.statement_limit {
            self.backend.statement_limit(Some(limit))?;
        }
        self.open = true;
        self.failed = None;
        Ok(())
    }

    /// Close the plugin window; the first SQL error it saw, if any.
    pub(crate) fn end_plugin_window(&mut self) -> Option<DbError> {
        self.open = false;
        let failed = self.failed.take();
        if self.statement_limit.is_some()
            && let Err(e) = self.backend.statement_limit(None)
        {
            return failed.or(Some(e));
        }
        failed
    }

    pub(crate) fn commit(&mut self) -> Result<(), DbError> {
        self.open = false;
        self.backend.batch("COMMIT")
    }

    pub(crate) fn rollback(&mut self) {
        self.open = false;
        self.failed = None;
        if let Err(e) = self.backend.batch("ROLLBACK") {
            tracing::warn!("rollback failed: {e}");
        }
    }
}

#[cfg(test)]
mod tests;
