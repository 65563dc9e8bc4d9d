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
//! [`Dialect`], the [`Backend`] trait), URL handling ([`connect`],
//! [`redact`], [`sink_identity`]) and the session the driver and plugins
//! share ([`SqlGrant`]); `sqlite` and `postgres` are the backends, `guard`
//! the checks on plugin statements before they run, `role` the plugin
//! role's check on PostgreSQL, `dry` the backend of `host test`'s dry run
//! (no database).

use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

mod dry;
mod guard;
pub mod password;
mod postgres;
mod role;
mod sqlite;

use self::guard::{Approved, REFUSED, first_keyword};
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
    /// session), a busy SQLite database. Nothing was applied; the same
    /// work may be done again after a pause.
    pub fn is_contention(&self) -> bool {
        self.code.starts_with("40") || self.code == "55P03" || self.code == "SQLITE_BUSY"
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

/// [`sink_identity`] of a sink whose host tables are in `schema`
/// (`--sink-schema`): `#schema=NAME` is appended unless it is the default
/// (`public`), so identities recorded before the setting existed still
/// match.
///
/// # Errors
/// As [`sink_identity`].
pub fn sink_identity_in(url: &str, schema: Option<&str>) -> std::io::Result<String> {
    let id = sink_identity(url)?;
    Ok(match schema {
        Some(s) if s != "public" && !id.starts_with("sqlite:") => format!("{id}#schema={s}"),
        _ => id,
    })
}

/// Run `ddl` (`CREATE TABLE IF NOT EXISTS …` statements) on `b`, again
/// when another host running the same at the same moment made it fail:
/// [`DbError::is_concurrent_create`] (up to 3 more times), or SQLite busy
/// (for up to 5 s). Hosts of one pipeline group start together.
///
/// # Errors
/// The database's error.
pub fn create_tables(b: &mut dyn Backend, ddl: &str) -> Result<(), DbError> {
    let (mut raced, mut busy) = (0, 0);
    loop {
        match b.batch(ddl) {
            Err(e) if e.is_concurrent_create() && raced < 3 => raced += 1,
            Err(e) if e.code == "SQLITE_BUSY" && busy < 50 => {
                busy += 1;
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            r => return r,
        }
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

/// The database a `--sink-db` URL names.
enum SinkUrl<'a> {
    /// `sqlite:PATH` or `sqlite://PATH`: the path.
    Sqlite(&'a str),
    /// `postgres://…` or `postgresql://…`.
    Postgres,
}

/// Read the form of a `--sink-db` URL: `sqlite:PATH` (also
/// `sqlite://PATH`, a non-empty path) or `postgres://…` /
/// `postgresql://…`.
fn parse_url(url: &str) -> Result<SinkUrl<'_>, String> {
    match url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
    {
        Some("") => Err("sqlite: needs a path, e.g. sqlite:./sink.db".into()),
        Some(path) => Ok(SinkUrl::Sqlite(path)),
        None if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
            Ok(SinkUrl::Postgres)
        }
        None => Err(format!(
            "unsupported sink database `{}`: use sqlite:PATH or postgres://USER@HOST:PORT/DB (also postgresql://)",
            redact(url)
        )),
    }
}

/// Check the form of a `--sink-db` URL without connecting (see
/// [`connect`] for the forms). For the command line, so that another
/// scheme (`mysql://…`) is a usage error (exit 2) before anything starts.
///
/// # Errors
/// What is wrong with `url`, with the password hidden.
pub fn check_url(url: &str) -> Result<String, String> {
    parse_url(url).map(|_| url.to_string())
}

/// [`connect`], with a PostgreSQL password read from `password_file`
/// when the URL has none (see `password`).
///
/// # Errors
/// As [`connect`]; the password file cannot be read.
pub fn connect_with(url: &str, password_file: Option<&Path>) -> Result<Box<dyn Backend>, DbError> {
    match parse_url(url).map_err(DbError::host)? {
        SinkUrl::Sqlite(path) => Ok(Box::new(Sqlite::open(path)?)),
        SinkUrl::Postgres => Ok(Box::new(Postgres::connect(url, password_file)?)),
    }
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
    approved: std::collections::HashMap<String, Approved>,
    /// The same for texts longer than [`APPROVED_MAX_LEN`] (a multi-row
    /// statement of thousands of values), by their SHA-256, so that
    /// neither their parse nor their bytes are repeated.
    approved_long: std::collections::HashMap<[u8; 32], Approved>,
    /// The schema of the host's tables (PostgreSQL; `None`: `public`).
    host_schema: Option<String>,
    /// The role plugin statements run as (PostgreSQL; `None`: the
    /// session's own).
    plugin_role: Option<String>,
    /// [`Backend::transaction_mark`] when the plugin window opened.
    mark: Option<String>,
    /// Plugin statements kept since the last [`SqlGrant::take_ran`]
    /// (`None`: not recording).
    ran: Option<Vec<Ran>>,
    /// No database behind the backend ([`SqlGrant::dry`]).
    dry: bool,
}

/// Most distinct statement texts remembered in [`Session::approved`] (and
/// as many in [`Session::approved_long`]).
const APPROVED_CAP: usize = 256;
/// Longest statement text remembered as text, bytes (longer ones are
/// remembered by digest), so the cache holds at most
/// `APPROVED_CAP × (APPROVED_MAX_LEN + 32)` bytes whatever a plugin sends.
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
            approved: std::collections::HashMap::new(),
            approved_long: std::collections::HashMap::new(),
            host_schema: None,
            plugin_role: None,
            mark: None,
            ran: None,
            dry: false,
        })))
    }

    /// A session with no database (`host test`'s dry run): plugin
    /// statements are checked as on `dialect` and recorded, not run; each
    /// changes no rows and each query returns no rows. Records from the
    /// start ([`SqlGrant::record`]).
    pub fn dry(dialect: Dialect) -> Self {
        let g = Self::new(Box::new(dry::Dry(dialect)));
        {
            let mut s = g.lock();
            s.dry = true;
            s.ran = Some(Vec::new());
        }
        g
    }

    /// Keep every plugin statement from now on, with its parameters and
    /// outcome, until taken with [`SqlGrant::take_ran`].
    pub fn record(&self) {
        let mut s = self.lock();
        if s.ran.is_none() {
            s.ran = Some(Vec::new());
        }
    }

    /// The plugin statements kept since the last call (empty when not
    /// recording).
    pub fn take_ran(&self) -> Vec<Ran> {
        self.lock()
            .ran
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Open a transaction for a rehearsal (`host test`): the plugin's
    /// statements run in it as in a part of `host run`, and
    /// [`SqlGrant::end_rehearsal`] commits or rolls it back. No host table
    /// is read or written.
    ///
    /// # Errors
    /// The database's error opening the transaction.
    pub fn begin_rehearsal(&self) -> Result<(), DbError> {
        let mut s = self.lock();
        s.begin()?;
        s.open_plugin_window()
    }

    /// End the rehearsal's transaction: commit it when `keep` and nothing
    /// failed, else roll it back (nothing of it stays). The error that
    /// would have failed the part under `host run`, if any: the first SQL
    /// error of the window (even one the plugin caught and went on), a
    /// changed transaction, role or settings, or the commit's own error.
    pub fn end_rehearsal(&self, keep: bool) -> Option<DbError> {
        let mut s = self.lock();
        let failed = s.end_plugin_window();
        if keep && failed.is_none() {
            return s.commit().err();
        }
        s.rollback();
        failed
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

    /// Keep the host's tables in `schema` (PostgreSQL, `--sink-schema`;
    /// default `public`), named with it in every statement, never looked
    /// up through `search_path`.
    ///
    /// # Errors
    /// A schema other than `main` on SQLite.
    pub fn set_host_schema(&self, schema: Option<String>) -> Result<(), DbError> {
        let mut s = self.lock();
        if s.backend.dialect() == Dialect::Sqlite
            && let Some(schema) = schema.as_deref().filter(|s| *s != "main")
        {
            return Err(DbError::host(format!(
                "--sink-schema {schema}: SQLite keeps the host's tables in `main`; the setting is for PostgreSQL"
            )));
        }
        s.host_schema = schema;
        Ok(())
    }

    /// The schema of the host's tables: `main` on SQLite, the one set by
    /// [`SqlGrant::set_host_schema`] or `public` on PostgreSQL.
    pub fn host_schema(&self) -> String {
        let s = self.lock();
        match s.backend.dialect() {
            Dialect::Sqlite => "main".to_string(),
            Dialect::Postgres => s.host_schema.clone().unwrap_or_else(|| "public".into()),
        }
    }

    /// Run plugin statements as `role` (PostgreSQL, `--sink-plugin-role`):
    /// `SET LOCAL ROLE` for the plugin's window of each transaction, so
    /// the database itself keeps plugins off the host's tables. Check the
    /// role with [`SqlGrant::check_plugin_role`] once the tables exist.
    ///
    /// # Errors
    /// A role on SQLite, which has none.
    pub fn set_plugin_role(&self, role: Option<String>) -> Result<(), DbError> {
        let mut s = self.lock();
        if s.backend.dialect() == Dialect::Sqlite && role.is_some() {
            return Err(DbError::host(
                "--sink-plugin-role is for PostgreSQL; on SQLite the authorizer keeps plugins off the host's tables",
            ));
        }
        s.plugin_role = role;
        Ok(())
    }

    /// The role plugin statements run as, if one is set.
    pub fn plugin_role(&self) -> Option<String> {
        self.lock().plugin_role.clone()
    }

    /// Bound every plugin statement to `limit` (the plugin call deadline):
    /// PostgreSQL's `statement_timeout` (SQLSTATE 57014 when it fires),
    /// SQLite's progress handler (the statement is interrupted). On
    /// PostgreSQL a lock wait ends at half of it (`lock_timeout`, SQLSTATE
    /// 55P03, [`DbError::is_contention`]), so a row held by someone else is
    /// told apart from a slow statement.
    ///
    /// On PostgreSQL it also ends a session that stays idle inside an open
    /// transaction for `max(60 s, 3 × limit)` (`idle_in_transaction_session_timeout`):
    /// a host frozen mid-part (SIGSTOP, a stalled VM) would otherwise hold
    /// its row locks, and a pipeline group's next owner would wait on
    /// them for as long.
    ///
    /// # Errors
    /// The database's error setting it.
    pub fn limit_statements(&self, limit: std::time::Duration) -> Result<(), DbError> {
        let mut s = self.lock();
        s.statement_limit = Some(limit);
        s.apply_idle_limit()
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
        s.apply_idle_limit()
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
        let r = s.guarded(sql, |b| b.execute(sql, params));
        s.keep_ran(sql, params, false, r.as_ref().map(|n| *n));
        r
    }

    /// A plugin's `execute-batch`: `sql` once per parameter row of
    /// `rows`, in order, checked once; the total number of rows changed.
    /// Each row is run and recorded as its own `execute` would be.
    ///
    /// # Errors
    /// The index in `rows` of the row that failed (0 when the statement
    /// is refused) and its error; either aborts the range.
    pub fn plugin_execute_batch(
        &self,
        sql: &str,
        rows: &[Vec<SqlValue>],
    ) -> Result<u64, (usize, DbError)> {
        let mut s = self.lock();
        let approved = s.approve(sql).map_err(|e| (0, e))?;
        // Row by row where each row must be checked after it runs
        // (`watch`) or recorded with its own outcome.
        if approved.watch || s.ran.is_some() {
            let mut changed = 0;
            for (i, params) in rows.iter().enumerate() {
                let r = s.run_approved(approved, |b| b.execute(sql, params));
                s.keep_ran(sql, params, false, r.as_ref().map(|n| *n));
                changed += r.map_err(|e| (i, e))?;
            }
            return Ok(changed);
        }
        let mut failed_row = 0;
        s.run_approved(approved, |b| {
            b.execute_many(sql, rows).map_err(|(i, e)| {
                failed_row = i;
                e
            })
        })
        .map(|counts| counts.iter().sum())
        .map_err(|e| (failed_row, e))
    }

    /// A plugin's `query`.
    ///
    /// # Errors
    /// As [`SqlGrant::plugin_execute`].
    pub fn plugin_query(&self, sql: &str, params: &[SqlValue]) -> Result<QueryRows, DbError> {
        let mut s = self.lock();
        let r = s.guarded(sql, |b| b.query(sql, params));
        s.keep_ran(sql, params, true, r.as_ref().map(|q| q.rows.len() as u64));
        r
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
    /// Keep a plugin statement when recording ([`SqlGrant::record`]).
    fn keep_ran(
        &mut self,
        sql: &str,
        params: &[SqlValue],
        query: bool,
        outcome: Result<u64, &DbError>,
    ) {
        let dry = self.dry;
        if let Some(ran) = &mut self.ran {
            ran.push(Ran {
                sql: sql.to_string(),
                params: params.to_vec(),
                query,
                outcome: outcome.map(|n| (!dry).then_some(n)).map_err(Clone::clone),
            });
        }
    }

    fn guarded<T>(
        &mut self,
        sql: &str,
        f: impl FnOnce(&mut dyn Backend) -> Result<T, DbError>,
    ) -> Result<T, DbError> {
        let approved = self.approve(sql)?;
        self.run_approved(approved, f)
    }

    /// Whether a plugin may run `sql` now: inside a range whose
    /// transaction has not failed, and passing [`Session::check`]
    /// (remembered per statement text).
    fn approve(&mut self, sql: &str) -> Result<Approved, DbError> {
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
        let digest = (sql.len() > APPROVED_MAX_LEN).then(|| {
            use sha2::Digest as _;
            <[u8; 32]>::from(sha2::Sha256::digest(sql.as_bytes()))
        });
        let known = match &digest {
            Some(d) => self.approved_long.get(d),
            None => self.approved.get(sql),
        };
        let approved = match known {
            Some(a) => *a,
            None => {
                let a = self
                    .check(sql)
                    .inspect_err(|e| self.failed = Some(e.clone()))?;
                match digest {
                    Some(d) => {
                        if self.approved_long.len() >= APPROVED_CAP {
                            self.approved_long.clear();
                        }
                        self.approved_long.insert(d, a);
                    }
                    None => {
                        if self.approved.len() >= APPROVED_CAP {
                            self.approved.clear();
                        }
                        self.approved.insert(sql.to_string(), a);
                    }
                }
                a
            }
        };
        Ok(approved)
    }

    /// Run an approved plugin statement in plugin mode, then check that
    /// it left the host's transaction as it was; any error fails the
    /// transaction.
    fn run_approved<T>(
        &mut self,
        approved: Approved,
        f: impl FnOnce(&mut dyn Backend) -> Result<T, DbError>,
    ) -> Result<T, DbError> {
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
        } else if approved.watch
            && let Err(e) = self.check_mark()
        {
            self.failed = Some(e.clone());
            return Err(e);
        }
        r
    }

    /// Refuse what a plugin may not run: on PostgreSQL by parsing the
    /// statement ([`guard::check_postgres`]); on SQLite by its first
    /// keyword (the authorizer checks the compiled statement after).
    fn check(&mut self, sql: &str) -> Result<Approved, DbError> {
        if self.backend.dialect() == Dialect::Postgres {
            return guard::check_postgres(sql).map_err(DbError::host);
        }
        let kw = first_keyword(sql);
        if REFUSED.contains(&kw.as_str()) {
            return Err(DbError::host(format!(
                "`{kw}` statements are not allowed: the host owns the transaction and the connection"
            )));
        }
        Ok(Approved { watch: false })
    }

    /// See [`SqlGrant::limit_statements`].
    fn apply_idle_limit(&mut self) -> Result<(), DbError> {
        let Some(limit) = self.statement_limit else {
            return Ok(());
        };
        if self.backend.dialect() != Dialect::Postgres {
            return Ok(());
        }
        let idle = (limit * 3).max(std::time::Duration::from_secs(60));
        self.backend.batch(&format!(
            "SET idle_in_transaction_session_timeout = {}",
            idle.as_millis()
        ))
    }

    /// The transaction and role are still those the plugin window opened
    /// with ([`Backend::transaction_mark`]).
    fn check_mark(&mut self) -> Result<(), DbError> {
        let Some(before) = self.mark.clone() else {
            return Ok(());
        };
        let now = self.backend.transaction_mark()?;
        if now.as_deref() != Some(before.as_str()) {
            return Err(DbError::host(format!(
                "a plugin statement changed the host's transaction, role or settings (was {before}; now {}): the part is rolled back",
                now.unwrap_or_default()
            )));
        }
        Ok(())
    }

    pub(crate) fn backend(&mut self) -> &mut dyn Backend {
        self.backend.as_mut()
    }

    /// Open the host's transaction (the plugin window stays closed).
    pub(crate) fn begin(&mut self) -> Result<(), DbError> {
        let sql = match self.backend.dialect() {
            Dialect::Sqlite => "BEGIN IMMEDIATE",
            Dialect::Postgres => "BEGIN ISOLATION LEVEL READ COMMITTED",
        };
        self.backend.batch(sql)?;
        self.open = false;
        self.failed = None;
        self.mark = None;
        Ok(())
    }

    /// Let the plugin's statements run, inside the open transaction: under
    /// the statement time limit and the plugin role, with the transaction's
    /// mark taken to compare after them.
    pub(crate) fn open_plugin_window(&mut self) -> Result<(), DbError> {
        let role = self.plugin_role.clone();
        self.backend
            .enter_plugin_window(self.statement_limit, role.as_deref())?;
        self.mark = self.backend.transaction_mark()?;
        self.open = true;
        self.failed = None;
        Ok(())
    }

    /// Close the plugin window; the first SQL error it saw, if any, or a
    /// transaction or role that is no longer the one it opened with.
    pub(crate) fn end_plugin_window(&mut self) -> Option<DbError> {
        if !self.open {
            return None;
        }
        self.open = false;
        let failed = self.failed.take();
        let changed = match failed {
            Some(_) => None,
            None => self.check_mark().err(),
        };
        self.mark = None;
        if let Err(e) = self.backend.leave_plugin_window() {
            return failed.or(changed).or(Some(e));
        }
        failed.or(changed)
    }

    pub(crate) fn commit(&mut self) -> Result<(), DbError> {
        self.open = false;
        self.backend.batch("COMMIT")
    }

    pub(crate) fn rollback(&mut self) {
        self.open = false;
        self.failed = None;
        self.mark = None;
        if let Err(e) = self.backend.batch("ROLLBACK") {
            tracing::warn!("rollback failed: {e}");
        }
    }
}

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
mod tests;
