//! The SQL capability: one database connection owned by the host, shared
//! between the sink driver (which brackets each partition range in a
//! transaction with its progress row) and the plugin's `sql` imports (which
//! run inside that transaction).
//!
//! Backends: SQLite through rusqlite with the bundled library
//! (`sqlite:PATH`), PostgreSQL through the `postgres` client
//! (`postgres://…`). Placeholders are `$1 … $n` on both: SQLite binds them
//! by name (`$1` is a named parameter there), PostgreSQL natively.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use postgres::types::{IsNull, ToSql, Type, to_sql_checked};

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
        self.code.starts_with("08") || self.code.starts_with("40") || self.code == "SQLITE_BUSY"
    }

    fn host(message: impl Into<String>) -> Self {
        DbError {
            message: message.into(),
            code: "sluice".into(),
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
    /// Why the backend's access control refused the last plugin
    /// statement, if it did (taken: a second call answers `None`).
    fn take_denial(&mut self) -> Option<String> {
        None
    }
}

// ------------------------------------------------------------------ SQLite

struct Sqlite {
    conn: rusqlite::Connection,
    auth: Arc<AuthState>,
}

/// What SQLite's authorizer callback shares with the connection's owner.
#[derive(Default)]
struct AuthState {
    /// Statements being prepared now are a plugin's.
    untrusted: std::sync::atomic::AtomicBool,
    /// The reason of the last refusal.
    denied: Mutex<Option<String>>,
}

/// SQLite's verdict on one action of a plugin's statement: `None` allows
/// it, `Some(reason)` refuses it.
///
/// SQLite asks while it compiles a statement, for every table and column
/// read or written, every trigger and view body the statement runs, and
/// every ATTACH, PRAGMA and transaction statement
/// (<https://www.sqlite.org/c3ref/set_authorizer.html>), so a refusal does
/// not depend on how the SQL text is spelled. Unknown actions (a newer
/// SQLite) are refused.
fn sqlite_verdict(action: &rusqlite::hooks::AuthAction<'_>) -> Option<String> {
    use rusqlite::hooks::AuthAction as A;
    let table = match action {
        A::Transaction { .. } | A::Savepoint { .. } => {
            return Some(
                "transaction control is not allowed: the host owns the transaction".into(),
            );
        }
        A::Attach { filename } => {
            return Some(format!(
                "ATTACH `{filename}` is not allowed: plugins reach only the granted database"
            ));
        }
        A::Detach { .. } => {
            return Some("DETACH is not allowed: the host owns the connection".into());
        }
        A::Pragma { pragma_name, .. } => {
            return Some(format!(
                "PRAGMA {pragma_name} is not allowed: the host owns the connection's settings"
            ));
        }
        A::Function { function_name } if function_name.eq_ignore_ascii_case("load_extension") => {
            return Some("load_extension is not allowed".into());
        }
        // SQLite tells the authorizer only the old name of a table being
        // renamed; a temporary table renamed to a host table's name would
        // shadow it for unqualified names. The host qualifies its own, and
        // plugins have no need to alter temporary tables.
        A::AlterTable { database_name, .. } if database_name.eq_ignore_ascii_case("temp") => {
            return Some("ALTER TABLE on a temporary table is not allowed".into());
        }
        A::Unknown { code, .. } => {
            return Some(format!("SQLite action {code} is not known to the host"));
        }
        A::CreateIndex { table_name, .. }
        | A::CreateTempIndex { table_name, .. }
        | A::CreateTable { table_name }
        | A::CreateTempTable { table_name }
        | A::CreateTrigger { table_name, .. }
        | A::CreateTempTrigger { table_name, .. }
        | A::Delete { table_name }
        | A::DropIndex { table_name, .. }
        | A::DropTempIndex { table_name, .. }
        | A::DropTable { table_name }
        | A::DropTempTable { table_name }
        | A::DropTrigger { table_name, .. }
        | A::DropTempTrigger { table_name, .. }
        | A::Insert { table_name }
        | A::Read { table_name, .. }
        | A::Update { table_name, .. }
        | A::AlterTable { table_name, .. }
        | A::Analyze { table_name }
        | A::CreateVtable { table_name, .. }
        | A::DropVtable { table_name, .. } => *table_name,
        A::CreateView { view_name }
        | A::CreateTempView { view_name }
        | A::DropView { view_name }
        | A::DropTempView { view_name } => *view_name,
        _ => return None,
    };
    HOST_TABLES
        .iter()
        .find(|t| t.eq_ignore_ascii_case(table))
        .map(|t| format!("table {t} belongs to the host; plugins may not use it"))
}

fn sqlite_err(e: rusqlite::Error) -> DbError {
    match &e {
        rusqlite::Error::SqliteFailure(f, msg) => DbError {
            message: msg.clone().unwrap_or_else(|| f.to_string()),
            code: sqlite_code_name(f.extended_code),
        },
        _ => DbError {
            message: e.to_string(),
            code: "SQLITE_MISUSE".into(),
        },
    }
}

/// The name of a SQLite (extended) result code.
fn sqlite_code_name(code: i32) -> String {
    use rusqlite::ffi;
    let name = match code {
        ffi::SQLITE_CONSTRAINT_PRIMARYKEY => "SQLITE_CONSTRAINT_PRIMARYKEY",
        ffi::SQLITE_CONSTRAINT_UNIQUE => "SQLITE_CONSTRAINT_UNIQUE",
        ffi::SQLITE_CONSTRAINT_NOTNULL => "SQLITE_CONSTRAINT_NOTNULL",
        ffi::SQLITE_CONSTRAINT_FOREIGNKEY => "SQLITE_CONSTRAINT_FOREIGNKEY",
        ffi::SQLITE_CONSTRAINT_CHECK => "SQLITE_CONSTRAINT_CHECK",
        ffi::SQLITE_BUSY => "SQLITE_BUSY",
        ffi::SQLITE_LOCKED => "SQLITE_LOCKED",
        ffi::SQLITE_READONLY => "SQLITE_READONLY",
        ffi::SQLITE_IOERR => "SQLITE_IOERR",
        ffi::SQLITE_CORRUPT => "SQLITE_CORRUPT",
        ffi::SQLITE_FULL => "SQLITE_FULL",
        ffi::SQLITE_CANTOPEN => "SQLITE_CANTOPEN",
        ffi::SQLITE_MISMATCH => "SQLITE_MISMATCH",
        ffi::SQLITE_RANGE => "SQLITE_RANGE",
        _ => match code & 0xff {
            ffi::SQLITE_ERROR => "SQLITE_ERROR",
            ffi::SQLITE_CONSTRAINT => "SQLITE_CONSTRAINT",
            ffi::SQLITE_BUSY => "SQLITE_BUSY",
            ffi::SQLITE_IOERR => "SQLITE_IOERR",
            _ => return format!("SQLITE_{code}"),
        },
    };
    name.to_string()
}

/// `$1`, `$2`, … : the names SQLite gives `$n` placeholders, made once
/// (looked up for every bound parameter of every statement).
static PARAM_NAMES: std::sync::LazyLock<Vec<String>> =
    std::sync::LazyLock::new(|| (1..=64).map(|i| format!("${i}")).collect());

impl Sqlite {
    fn open(path: &str) -> Result<Self, DbError> {
        let conn = rusqlite::Connection::open(path).map_err(sqlite_err)?;
        // WAL with synchronous=FULL: a COMMIT is durable when it returns,
        // which the checkpoint's commit entry relies on.
        conn.execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA busy_timeout = 10000;",
        )
        .map_err(sqlite_err)?;
        conn.set_prepared_statement_cache_capacity(64);
        // No writable schema, no shadow-table writes, no journal_mode=OFF
        // from plugin SQL (https://www.sqlite.org/c3ref/c_dbconfig_defensive.html).
        conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_DEFENSIVE, true)
            .map_err(sqlite_err)?;
        // Installed once; it judges only while a plugin statement is being
        // prepared (SQLite also re-prepares a cached statement after a
        // schema change, and the host's own statements must pass then).
        let auth = Arc::new(AuthState::default());
        let state = Arc::clone(&auth);
        conn.authorizer(Some(move |ctx: rusqlite::hooks::AuthContext<'_>| {
            use rusqlite::hooks::Authorization;
            if !state.untrusted.load(std::sync::atomic::Ordering::Relaxed) {
                return Authorization::Allow;
            }
            match sqlite_verdict(&ctx.action) {
                None => Authorization::Allow,
                Some(why) => {
                    *state.denied.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
                    Authorization::Deny
                }
            }
        }));
        Ok(Sqlite { conn, auth })
    }

    fn untrusted(&self) -> bool {
        self.auth
            .untrusted
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Prepare `sql` and bind `params`, then run `f` on the statement.
    ///
    /// Only plugin statements go through the statement cache: they were
    /// compiled under the authorizer's plugin rules, so a plugin that
    /// sends the text of a host statement gets its own compilation (and
    /// its refusal) instead of the host's cached one.
    fn with_statement<T>(
        &self,
        sql: &str,
        params: &[SqlValue],
        f: impl FnOnce(&mut rusqlite::Statement<'_>) -> Result<T, DbError>,
    ) -> Result<T, DbError> {
        if self.untrusted() {
            let mut stmt = self.conn.prepare_cached(sql).map_err(sqlite_err)?;
            Self::bind(&mut stmt, params)?;
            f(&mut stmt)
        } else {
            let mut stmt = self.conn.prepare(sql).map_err(sqlite_err)?;
            Self::bind(&mut stmt, params)?;
            f(&mut stmt)
        }
    }

    fn bind(stmt: &mut rusqlite::Statement<'_>, params: &[SqlValue]) -> Result<(), DbError> {
        let expected = stmt.parameter_count();
        if expected != params.len() {
            return Err(DbError {
                message: format!(
                    "statement has {expected} parameters, {} given",
                    params.len()
                ),
                code: "SQLITE_RANGE".into(),
            });
        }
        for (i, v) in params.iter().enumerate() {
            let idx = match PARAM_NAMES.get(i) {
                Some(name) => stmt.parameter_index(name),
                None => stmt.parameter_index(&format!("${}", i + 1)),
            }
            .map_err(sqlite_err)?
            .unwrap_or(i + 1);
            let r = match v {
                SqlValue::Null => stmt.raw_bind_parameter(idx, rusqlite::types::Null),
                SqlValue::Integer(n) => stmt.raw_bind_parameter(idx, n),
                SqlValue::Real(r) => stmt.raw_bind_parameter(idx, r),
                SqlValue::Text(t) => stmt.raw_bind_parameter(idx, t),
                SqlValue::Blob(b) => stmt.raw_bind_parameter(idx, b),
            };
            r.map_err(sqlite_err)?;
        }
        Ok(())
    }
}

impl Backend for Sqlite {
    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }

    fn batch(&mut self, sql: &str) -> Result<(), DbError> {
        self.conn.execute_batch(sql).map_err(sqlite_err)
    }

    fn execute(&mut self, sql: &str, params: &[SqlValue]) -> Result<u64, DbError> {
        self.with_statement(sql, params, |stmt| {
            stmt.raw_execute().map(|n| n as u64).map_err(sqlite_err)
        })
    }

    fn query(&mut self, sql: &str, params: &[SqlValue]) -> Result<QueryRows, DbError> {
        self.with_statement(sql, params, sqlite_rows)
    }

    fn in_autocommit(&self) -> Option<bool> {
        Some(self.conn.is_autocommit())
    }

    fn blob_type(&self) -> &'static str {
        "BLOB"
    }

    fn set_untrusted(&mut self, on: bool) {
        self.auth
            .untrusted
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    fn take_denial(&mut self) -> Option<String> {
        self.auth
            .denied
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }
}

/// Every row of a bound SQLite statement, as [`SqlValue`]s.
fn sqlite_rows(stmt: &mut rusqlite::Statement<'_>) -> Result<QueryRows, DbError> {
    let columns: Vec<String> = stmt.column_names().iter().map(|c| c.to_string()).collect();
    let mut rows = stmt.raw_query();
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(sqlite_err)? {
        let mut vals = Vec::with_capacity(columns.len());
        for i in 0..columns.len() {
            use rusqlite::types::ValueRef;
            vals.push(match row.get_ref(i).map_err(sqlite_err)? {
                ValueRef::Null => SqlValue::Null,
                ValueRef::Integer(n) => SqlValue::Integer(n),
                ValueRef::Real(r) => SqlValue::Real(r),
                ValueRef::Text(t) => SqlValue::Text(String::from_utf8_lossy(t).into_owned()),
                ValueRef::Blob(b) => SqlValue::Blob(b.to_vec()),
            });
        }
        out.push(vals);
    }
    Ok(QueryRows { columns, rows: out })
}

// -------------------------------------------------------------- PostgreSQL

struct Postgres {
    client: postgres::Client,
    statements: HashMap<String, postgres::Statement>,
}

fn pg_err(e: postgres::Error) -> DbError {
    match e.as_db_error() {
        Some(db) => DbError {
            message: db.message().to_string(),
            code: db.code().code().to_string(),
        },
        None => DbError {
            // With the causes ("connection refused", an unknown host …),
            // which the client's own message leaves out.
            message: {
                let mut m = e.to_string();
                let mut source = std::error::Error::source(&e);
                while let Some(s) = source {
                    m.push_str(": ");
                    m.push_str(&s.to_string());
                    source = s.source();
                }
                m
            },
            code: e
                .code()
                .map_or_else(|| "08000".to_string(), |c| c.code().to_string()),
        },
    }
}

/// Binds a [`SqlValue`] to whatever type the server inferred for the
/// placeholder: integers to int2/int4/int8/float/numeric-as-text/bool,
/// text to text-like types, JSON and others that accept text.
impl ToSql for SqlValue {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut postgres::types::private::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self {
            SqlValue::Null => Ok(IsNull::Yes),
            SqlValue::Integer(n) => match *ty {
                Type::INT2 => i16::try_from(*n)?.to_sql(ty, out),
                Type::INT4 => i32::try_from(*n)?.to_sql(ty, out),
                Type::INT8 => n.to_sql(ty, out),
                Type::FLOAT4 => (*n as f32).to_sql(ty, out),
                Type::FLOAT8 => (*n as f64).to_sql(ty, out),
                Type::BOOL => (*n != 0).to_sql(ty, out),
                _ => text_like(ty, &n.to_string(), out),
            },
            SqlValue::Real(r) => match *ty {
                Type::FLOAT4 => (*r as f32).to_sql(ty, out),
                Type::FLOAT8 => r.to_sql(ty, out),
                _ => text_like(ty, &r.to_string(), out),
            },
            SqlValue::Text(t) => match *ty {
                Type::INT2 => t.parse::<i16>()?.to_sql(ty, out),
                Type::INT4 => t.parse::<i32>()?.to_sql(ty, out),
                Type::INT8 => t.parse::<i64>()?.to_sql(ty, out),
                Type::FLOAT4 => t.parse::<f32>()?.to_sql(ty, out),
                Type::FLOAT8 => t.parse::<f64>()?.to_sql(ty, out),
                Type::BOOL => matches!(t.as_str(), "t" | "true" | "1").to_sql(ty, out),
                Type::BYTEA => t.as_bytes().to_sql(ty, out),
                Type::JSONB => {
                    // jsonb's binary format: version byte 1, then the text.
                    out.extend_from_slice(&[1]);
                    out.extend_from_slice(t.as_bytes());
                    Ok(IsNull::No)
                }
                _ => text_like(ty, t, out),
            },
            SqlValue::Blob(b) => b.as_slice().to_sql(&Type::BYTEA, out),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

/// Text into a parameter whose binary format is the text itself; any
/// other type is refused with the usual fix (cast the placeholder).
fn text_like(
    ty: &Type,
    text: &str,
    out: &mut postgres::types::private::BytesMut,
) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
    match *ty {
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN | Type::JSON | Type::XML => {
            out.extend_from_slice(text.as_bytes());
            Ok(IsNull::No)
        }
        _ => Err(format!(
            "the sql capability cannot bind a value to a parameter of type {ty}; write the placeholder as `CAST($n AS TEXT)` and convert in SQL"
        )
        .into()),
    }
}

impl Postgres {
    fn connect(url: &str) -> Result<Self, DbError> {
        let client = postgres::Client::connect(url, postgres::NoTls).map_err(pg_err)?;
        Ok(Postgres {
            client,
            statements: HashMap::new(),
        })
    }

    fn statement(&mut self, sql: &str) -> Result<postgres::Statement, DbError> {
        if let Some(s) = self.statements.get(sql) {
            return Ok(s.clone());
        }
        let s = self.client.prepare(sql).map_err(pg_err)?;
        if self.statements.len() > 256 {
            self.statements.clear();
        }
        self.statements.insert(sql.to_string(), s.clone());
        Ok(s)
    }

    fn params(params: &[SqlValue]) -> Vec<&(dyn ToSql + Sync)> {
        params.iter().map(|p| p as &(dyn ToSql + Sync)).collect()
    }
}

fn pg_value(row: &postgres::Row, i: usize) -> Result<SqlValue, DbError> {
    let ty = row.columns()[i].type_().clone();
    let conv = |e: postgres::Error| DbError {
        message: format!("column {}: {e}", row.columns()[i].name()),
        code: "sluice".into(),
    };
    Ok(match ty {
        Type::INT2 => row
            .try_get::<_, Option<i16>>(i)
            .map_err(conv)?
            .map_or(SqlValue::Null, |v| SqlValue::Integer(v.into())),
        Type::INT4 => row
            .try_get::<_, Option<i32>>(i)
            .map_err(conv)?
            .map_or(SqlValue::Null, |v| SqlValue::Integer(v.into())),
        Type::INT8 => row
            .try_get::<_, Option<i64>>(i)
            .map_err(conv)?
            .map_or(SqlValue::Null, SqlValue::Integer),
        Type::FLOAT4 => row
            .try_get::<_, Option<f32>>(i)
            .map_err(conv)?
            .map_or(SqlValue::Null, |v| SqlValue::Real(v.into())),
        Type::FLOAT8 => row
            .try_get::<_, Option<f64>>(i)
            .map_err(conv)?
            .map_or(SqlValue::Null, SqlValue::Real),
        Type::BOOL => row
            .try_get::<_, Option<bool>>(i)
            .map_err(conv)?
            .map_or(SqlValue::Null, |v| SqlValue::Integer(v.into())),
        Type::BYTEA => row
            .try_get::<_, Option<Vec<u8>>>(i)
            .map_err(conv)?
            .map_or(SqlValue::Null, SqlValue::Blob),
        _ => match row.try_get::<_, Option<String>>(i) {
            Ok(v) => v.map_or(SqlValue::Null, SqlValue::Text),
            Err(_) => {
                return Err(DbError::host(format!(
                    "column {} has type {ty}, which the sql capability does not convert; cast it to text in the query",
                    row.columns()[i].name()
                )));
            }
        },
    })
}

impl Backend for Postgres {
    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }

    fn batch(&mut self, sql: &str) -> Result<(), DbError> {
        self.client.batch_execute(sql).map_err(pg_err)
    }

    fn execute(&mut self, sql: &str, params: &[SqlValue]) -> Result<u64, DbError> {
        let stmt = self.statement(sql)?;
        self.client
            .execute(&stmt, &Self::params(params))
            .map_err(pg_err)
    }

    fn query(&mut self, sql: &str, params: &[SqlValue]) -> Result<QueryRows, DbError> {
        let stmt = self.statement(sql)?;
        let columns: Vec<String> = stmt
            .columns()
            .iter()
            .map(|c| c.name().to_string())
            .collect();
        let rows = self
            .client
            .query(&stmt, &Self::params(params))
            .map_err(pg_err)?;
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            out.push(
                (0..columns.len())
                    .map(|i| pg_value(row, i))
                    .collect::<Result<Vec<_>, _>>()?,
            );
        }
        Ok(QueryRows { columns, rows: out })
    }

    fn in_autocommit(&self) -> Option<bool> {
        None
    }

    fn blob_type(&self) -> &'static str {
        "BYTEA"
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
        return Ok(Box::new(Postgres::connect(url)?));
    }
    Err(DbError::host(format!(
        "unsupported --sink-db `{}`: use sqlite:PATH or postgres://USER@HOST:PORT/DB",
        redact(url)
    )))
}

/// The first keyword of a statement, upper-cased (comments and empty
/// statements before it skipped).
fn first_keyword(sql: &str) -> String {
    let mut s = sql.trim_start_matches(|c: char| c.is_whitespace() || c == ';');
    loop {
        if let Some(rest) = s.strip_prefix("--") {
            s = rest.split_once('\n').map_or("", |(_, r)| r);
        } else if let Some(rest) = s.strip_prefix("/*") {
            s = rest.split_once("*/").map_or("", |(_, r)| r);
        } else {
            break;
        }
        s = s.trim_start_matches(|c: char| c.is_whitespace() || c == ';');
    }
    s.chars()
        .take_while(|c| c.is_ascii_alphabetic())
        .collect::<String>()
        .to_ascii_uppercase()
}

/// Statements a plugin may not run: they would end or escape the host's
/// transaction, or reach beyond the granted database. Checked on the
/// statement's text on both backends; on SQLite the authorizer
/// ([`sqlite_verdict`]) refuses the same actions again on the compiled
/// statement, except `VACUUM` (which SQLite does not pass to it, and whose
/// `VACUUM INTO` would write a file).
const REFUSED: &[&str] = &[
    "BEGIN",
    "START",
    "COMMIT",
    "END",
    "ROLLBACK",
    "ABORT",
    "SAVEPOINT",
    "RELEASE",
    "ATTACH",
    "DETACH",
    "PRAGMA",
    "VACUUM",
    "COPY",
    "PREPARE",
    "LISTEN",
    "NOTIFY",
    "SET",
    "RESET",
    "DISCARD",
    "LOCK",
    "DO",
    "CALL",
];

/// Tables the host owns; plugin SQL may not use them. On SQLite the
/// authorizer enforces this on the tables a compiled statement touches
/// (triggers and views included); on PostgreSQL the host can only look
/// for the names in the statement's text.
const HOST_TABLES: &[&str] = &["sluice_progress", "sluice_dead_letters"];

/// State behind the capability: the connection and the transaction the
/// driver has open for the current partition range.
pub struct Session {
    backend: Box<dyn Backend>,
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
        connect(url).map(Self::new)
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
        let kw = first_keyword(sql);
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
        self.open = true;
        self.failed = None;
        Ok(())
    }

    /// Close the plugin window; the first SQL error it saw, if any.
    pub(crate) fn end_plugin_window(&mut self) -> Option<DbError> {
        self.open = false;
        self.failed.take()
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
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted_from_urls() {
        assert_eq!(
            redact("postgres://sink:s3cr@t@db.example:5432/x"),
            "postgres://sink:***@db.example:5432/x"
        );
        assert_eq!(
            redact("postgres://sink@db:5432/x"),
            "postgres://sink@db:5432/x"
        );
        assert_eq!(redact("sqlite:./a:b@c.db"), "sqlite:./a:b@c.db");
        assert_eq!(
            redact("postgres://sink@db/x?sslmode=require&password=SECRET&sslpassword=K"),
            "postgres://sink@db/x?sslmode=require&password=***&sslpassword=***"
        );
        assert_eq!(
            redact("postgres://bob:sec?pw@127.0.0.1:5432/db"),
            "postgres://bob:***@127.0.0.1:5432/db"
        );
        assert_eq!(
            redact("postgres://sink@db/x?user=a@b&password=p"),
            "postgres://sink@db/x?user=a@b&password=***"
        );
        assert_eq!(
            sink_identity("sqlite:rel/sink.db").unwrap(),
            format!(
                "sqlite:{}",
                std::env::current_dir()
                    .unwrap()
                    .join("rel/sink.db")
                    .display()
            )
        );
        assert_eq!(
            redact("host=db user=sink password=SECRET dbname=x"),
            "host=db user=sink password=*** dbname=x"
        );
    }

    #[test]
    fn first_keywords() {
        assert_eq!(first_keyword("  -- hi\n /* x */ commit"), "COMMIT");
        assert_eq!(first_keyword("insert into t"), "INSERT");
        assert_eq!(first_keyword(""), "");
        assert_eq!(first_keyword(" ; ;\n-- x\n;vacuum into 'f'"), "VACUUM");
    }

    #[test]
    fn sqlite_binds_dollar_placeholders_by_number() {
        let mut b = Sqlite::open(":memory:").unwrap();
        b.batch("CREATE TABLE t (a TEXT, b INTEGER)").unwrap();
        b.execute(
            "INSERT INTO t (b, a) VALUES ($2, $1)",
            &[SqlValue::Text("x".into()), SqlValue::Integer(7)],
        )
        .unwrap();
        let r = b
            .query("SELECT a, b FROM t WHERE b = $1", &[SqlValue::Integer(7)])
            .unwrap();
        assert_eq!(r.columns, vec!["a", "b"]);
        assert_eq!(
            r.rows,
            vec![vec![SqlValue::Text("x".into()), SqlValue::Integer(7)]]
        );
        let e = b
            .execute("INSERT INTO t VALUES ($1, $2)", &[SqlValue::Null])
            .unwrap_err();
        assert!(e.message.contains("2 parameters, 1 given"), "{e}");
    }

    #[test]
    fn plugin_calls_outside_a_window_and_refused_statements_fail() {
        let g = SqlGrant::connect("sqlite::memory:").unwrap();
        assert!(
            g.plugin_execute("SELECT 1", &[])
                .unwrap_err()
                .message
                .contains("only available")
        );
        g.lock().begin().unwrap();
        let e = g.plugin_execute("COMMIT", &[]).unwrap_err();
        assert!(e.message.contains("not allowed"), "{e}");
        let again = g.plugin_execute("SELECT 1", &[]).unwrap_err();
        assert!(again.message.contains("already failed"), "{again}");
        g.lock().rollback();
    }

    #[test]
    fn guard_verdicts_are_remembered_only_for_allowed_statements() {
        let g = SqlGrant::connect("sqlite::memory:").unwrap();
        g.lock()
            .backend()
            .batch("CREATE TABLE sluice_progress (p INTEGER)")
            .unwrap();
        for _ in 0..3 {
            g.lock().begin().unwrap();
            // Rolled back at the end of each round, so made again.
            g.plugin_execute("CREATE TABLE t (a INTEGER)", &[]).unwrap();
            for i in 0..3 {
                g.plugin_execute("INSERT INTO t (a) VALUES ($1)", &[SqlValue::Integer(i)])
                    .unwrap();
            }
            // Refused every time, never remembered as allowed.
            let e = g
                .plugin_execute("DELETE FROM sluice_progress", &[])
                .unwrap_err();
            assert!(e.message.contains("belongs to the host"), "{e}");
            g.lock().rollback();
        }
        // Many distinct texts: the memory stays bounded.
        g.lock().begin().unwrap();
        for i in 0..(APPROVED_CAP + 10) {
            g.plugin_query(&format!("SELECT {i}"), &[]).unwrap();
        }
        assert!(g.lock().approved.len() <= APPROVED_CAP);
        // Long texts are checked but not kept.
        let long = format!("SELECT 1 {}", " ".repeat(APPROVED_MAX_LEN));
        g.plugin_query(&long, &[]).unwrap();
        assert!(!g.lock().approved.contains(&long));
        g.lock().rollback();
    }

    /// Ways around a text check that SQLite's authorizer closes; each must
    /// be refused with the host's reason and fail the transaction, and the
    /// host's own statements (same texts included) must keep working.
    #[test]
    fn sqlite_authorizer_refuses_what_the_text_does_not_show() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("sink.db");
        let g = SqlGrant::connect(&format!("sqlite:{}", db.display())).unwrap();
        let host_upsert = "INSERT INTO sluice_progress (p) VALUES ($1)";
        {
            let mut s = g.lock();
            let b = s.backend();
            b.batch("CREATE TABLE sluice_progress (p INTEGER)").unwrap();
            b.execute(host_upsert, &[SqlValue::Integer(1)]).unwrap();
        }
        let setup = [
            "CREATE TABLE t (a TEXT)",
            "CREATE TRIGGER tr AFTER INSERT ON t BEGIN DELETE FROM sluice_progress; END",
            "CREATE VIEW v AS SELECT p FROM sluice_progress",
            "CREATE TEMP TABLE shadow (p INTEGER)",
        ];
        g.lock().begin().unwrap();
        for sql in setup {
            g.plugin_execute(sql, &[]).unwrap();
        }
        g.lock().commit().unwrap();
        let attach = dir.path().join("escape.db");
        let refused: Vec<(String, &str)> = vec![
            // The trigger's body runs the plugin's insert into the host table.
            (
                "INSERT INTO t VALUES ('x')".into(),
                "sluice_progress belongs to the host",
            ),
            (
                "SELECT p FROM v".into(),
                "sluice_progress belongs to the host",
            ),
            // The exact text of a statement the host ran (and may cache).
            (host_upsert.into(), "sluice_progress belongs to the host"),
            (
                "CREATE TEMP TABLE SLUICE_PROGRESS (p INTEGER)".into(),
                "sluice_progress belongs to the host",
            ),
            (
                "CREATE TRIGGER t2 AFTER INSERT ON sluice_progress BEGIN SELECT 1; END".into(),
                "belongs to the host",
            ),
            (
                format!("SELECT 1; ATTACH '{}' AS x", attach.display()),
                "is not allowed",
            ),
            (
                format!(";ATTACH '{}' AS x", attach.display()),
                "not allowed",
            ),
            (";; vacuum into 'copy.db'".into(), "not allowed"),
            // A temporary table renamed to a host table's name would
            // shadow it for unqualified names.
            (
                "ALTER TABLE temp.shadow RENAME TO sluice_progress".into(),
                "temporary table is not allowed",
            ),
        ];
        for (sql, why) in &refused {
            g.lock().begin().unwrap();
            let e = g.plugin_query(sql, &[]).unwrap_err();
            assert!(e.message.contains(why), "{sql}: {e}");
            assert_eq!(e.code, "sluice", "{sql}: {e}");
            let again = g.plugin_query("SELECT 1", &[]).unwrap_err();
            assert!(again.message.contains("already failed"), "{sql}: {again}");
            g.lock().rollback();
        }
        assert!(!attach.exists(), "ATTACH created {}", attach.display());
        assert!(!dir.path().join("copy.db").exists());

        // No false positives: the host table's name as data, and the host's
        // own statements after the plugin's refusals.
        g.lock().begin().unwrap();
        g.plugin_execute("DROP TRIGGER tr", &[]).unwrap();
        g.plugin_execute(
            "INSERT INTO t VALUES ($1)",
            &[SqlValue::Text("sluice_progress".into())],
        )
        .unwrap();
        {
            let mut s = g.lock();
            s.end_plugin_window();
            let b = s.backend();
            b.execute(host_upsert, &[SqlValue::Integer(2)]).unwrap();
            let n = b
                .query("SELECT count(*) FROM sluice_progress", &[])
                .unwrap();
            assert_eq!(n.rows, vec![vec![SqlValue::Integer(2)]]);
            s.commit().unwrap();
        }
    }
}
