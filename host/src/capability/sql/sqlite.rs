//! The SQLite backend (rusqlite, bundled library): `$n` placeholders bound
//! by number, and the authorizer that refuses plugin statements touching the
//! host's tables, attaching files or controlling the transaction.

use std::sync::{Arc, Mutex};

use super::guard::HOST_TABLES;
use super::{Backend, DbError, Dialect, QueryRows, RowBudget, SqlValue};

pub(super) struct Sqlite {
    conn: rusqlite::Connection,
    auth: Arc<AuthState>,
    /// How long one plugin statement may run.
    limit: Option<std::time::Duration>,
    /// When the plugin statement running now must stop (read by the
    /// progress handler, which then interrupts it).
    deadline: Arc<std::sync::Mutex<Option<std::time::Instant>>>,
    /// [`numbered_placeholders`] of recent statement texts of at most
    /// [`REWRITE_MAX_LEN`] bytes: a sink sends the same statement for
    /// every record, and scanning its text each time was 5.6 % of the CPU
    /// samples of company -> SQLite. At most [`REWRITE_CAP`] texts.
    rewrites: std::collections::HashMap<String, Option<Arc<str>>>,
}

/// Longest statement text whose rewrite is remembered: longer ones are
/// multi-row statements, whose scan is small next to their rows.
const REWRITE_MAX_LEN: usize = 4096;

/// Most statement texts [`Sqlite::rewrites`] keeps (then it starts over).
const REWRITE_CAP: usize = 256;

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
        // The table-valued `pragma_table_info(name)` / `table_xinfo`
        // only read a table's column list (the `cdc` plugin reads its
        // destination tables' columns this way); a `PRAGMA` statement
        // itself is refused by its first keyword before it gets here.
        A::Pragma {
            pragma_name,
            pragma_value: Some(table),
        } if pragma_name.eq_ignore_ascii_case("table_info")
            || pragma_name.eq_ignore_ascii_case("table_xinfo") =>
        {
            *table
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
        ffi::SQLITE_INTERRUPT => "SQLITE_INTERRUPT",
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

/// `sql` with its `$n` placeholders written `?n`; `None` to leave it as
/// it is (no `$n`, or parameters of another form too).
///
/// SQLite reads `$1` as a parameter *name* (TCL style), and names are
/// looked up in a list: compiling a statement with n of them and binding
/// each by name both cost O(n²) string compares, which made a 5,000-value
/// multi-row insert slower per row than single-row ones. `?n` is
/// SQLite's numbered parameter (<https://www.sqlite.org/lang_expr.html#varparam>):
/// the same binding (each `$n` names the n-th value, a repeated `$n` the
/// same one), compiled in O(n) when the numbers ascend and bound by
/// number. Only a `$` that starts a token is rewritten: text in string
/// literals, quoted identifiers (`"…"`, `` `…` ``, `[…]`) and comments
/// is left alone, as are `$` inside identifiers (`a$1`) and `$0…`. A
/// statement that also has parameters of another form (`?`, `?5`,
/// `:name`, `@name`, `$name`, SQLite's TCL suffixes `$1::x` and `$1(x)`,
/// or `:$1`) is left as it is, so each keeps the slot SQLite gives it.
pub(super) fn numbered_placeholders(sql: &str) -> Option<String> {
    if !sql.contains('$') {
        return None;
    }
    let b = sql.as_bytes();
    // An identifier's bytes (SQLite takes any non-ASCII byte as one).
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b'$' || c >= 0x80;
    let mut out = String::with_capacity(sql.len());
    let mut copied = 0;
    let mut i = 0;
    while i < b.len() {
        // The end (exclusive) of a quoted or comment span starting at i.
        let skip_to = |close: &[u8], from: usize| {
            b[from..]
                .windows(close.len())
                .position(|w| w == close)
                .map_or(b.len(), |p| from + p + close.len())
        };
        match b[i] {
            q @ (b'\'' | b'"' | b'`') => {
                // A doubled quote inside is the quote itself: the span
                // ends at the first single one.
                let mut j = i + 1;
                while j < b.len() {
                    if b[j] == q {
                        if b.get(j + 1) == Some(&q) {
                            j += 2;
                            continue;
                        }
                        break;
                    }
                    j += 1;
                }
                i = (j + 1).min(b.len());
            }
            b'[' => i = skip_to(b"]", i + 1),
            b'-' if b.get(i + 1) == Some(&b'-') => i = skip_to(b"\n", i + 2),
            b'/' if b.get(i + 1) == Some(&b'*') => i = skip_to(b"*/", i + 2),
            // Another parameter form: `?`, `?NNN`, `:name`, `@name`,
            // `#name` (and `:$1`, one name to SQLite).
            b'?' => return None,
            b':' | b'@' | b'#' if b.get(i + 1).is_some_and(|&c| ident(c)) => return None,
            b'$' => {
                let digits = b[i + 1..]
                    .iter()
                    .position(|c| !c.is_ascii_digit())
                    .map_or(b.len(), |p| i + 1 + p);
                let next = b.get(digits).copied();
                // `$name`, `$1a`, `$0`, and the TCL suffixes `$1::x`,
                // `$1(x)` are names, not `$n`.
                if digits == i + 1
                    || b[i + 1] == b'0'
                    || next.is_some_and(ident)
                    || next == Some(b'(')
                    || (next == Some(b':') && b.get(digits + 1) == Some(&b':'))
                {
                    return None;
                }
                out.push_str(&sql[copied..i]);
                out.push('?');
                copied = i + 1;
                i = digits;
            }
            c if ident(c) => {
                // The rest of the identifier or number, `$` included.
                while i < b.len() && ident(b[i]) {
                    i += 1;
                }
            }
            _ => i += 1,
        }
    }
    if copied == 0 {
        return None;
    }
    out.push_str(&sql[copied..]);
    Some(out)
}

/// Create the database file `path` readable by its owner only (mode
/// 0600, as the checkpoint directory is private) when it does not exist
/// yet: SQLite would create it with the process's umask (usually 0644,
/// readable by every local user), and gives its `-wal` and `-shm` files
/// the main file's mode. An existing file keeps its mode; `:memory:` and
/// `file:` URIs are left to SQLite, as is any error here (SQLite reports
/// its own on open).
fn create_private(path: &str) {
    if path == ":memory:" || path.is_empty() || path.starts_with("file:") {
        return;
    }
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    if let Err(e) = o.open(path)
        && e.kind() != std::io::ErrorKind::AlreadyExists
    {
        tracing::debug!("creating {path}: {e}");
    }
}

impl Sqlite {
    pub(super) fn open(path: &str) -> Result<Self, DbError> {
        create_private(path);
        let conn = rusqlite::Connection::open(path).map_err(sqlite_err)?;
        // WAL with synchronous=FULL: a COMMIT is durable when it returns,
        // which the checkpoint's commit entry relies on.
        // Switching to WAL can be refused at once (SQLITE_BUSY, no busy
        // handler) while another process opens the same new file: hosts of
        // one pipeline group starting together. Try again for a while.
        let mut tries = 0;
        loop {
            match conn.execute_batch(
                "PRAGMA busy_timeout = 10000; PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL;",
            ) {
                Err(rusqlite::Error::SqliteFailure(e, _))
                    if e.code == rusqlite::ErrorCode::DatabaseBusy && tries < 50 =>
                {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
                r => break r.map_err(sqlite_err)?,
            }
        }
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
        // Checked every 1,000 virtual-machine instructions: a plugin
        // statement past its deadline is interrupted (SQLITE_INTERRUPT).
        let deadline = Arc::new(std::sync::Mutex::new(None::<std::time::Instant>));
        let watched = Arc::clone(&deadline);
        conn.progress_handler(
            1000,
            Some(move || {
                watched
                    .lock()
                    .ok()
                    .and_then(|d| *d)
                    .is_some_and(|d| std::time::Instant::now() > d)
            }),
        );
        Ok(Sqlite {
            conn,
            auth,
            limit: None,
            deadline,
            rewrites: std::collections::HashMap::new(),
        })
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
        &mut self,
        sql: &str,
        params: &[SqlValue],
        f: impl FnOnce(&mut rusqlite::Statement<'_>) -> Result<T, DbError>,
    ) -> Result<T, DbError> {
        let numbered = self.numbered(sql);
        let by_number = numbered.is_some();
        let sql = numbered.as_deref().unwrap_or(sql);
        if self.untrusted() {
            let mut stmt = self.conn.prepare_cached(sql).map_err(sqlite_err)?;
            Self::bind(&mut stmt, params, by_number)?;
            let set = |d| {
                if let Ok(mut g) = self.deadline.lock() {
                    *g = d;
                }
            };
            set(self.limit.map(|l| std::time::Instant::now() + l));
            let r = f(&mut stmt);
            set(None);
            match (r, self.limit) {
                (Err(e), Some(l)) if e.code == "SQLITE_INTERRUPT" => Err(DbError {
                    message: format!(
                        "the statement ran past its time limit of {} ms (the plugin call deadline) and was interrupted",
                        l.as_millis()
                    ),
                    code: e.code,
                }),
                (r, _) => r,
            }
        } else {
            let mut stmt = self.conn.prepare(sql).map_err(sqlite_err)?;
            Self::bind(&mut stmt, params, by_number)?;
            f(&mut stmt)
        }
    }

    /// [`numbered_placeholders`] of `sql`, remembered (see
    /// [`Sqlite::rewrites`]).
    fn numbered(&mut self, sql: &str) -> Option<Arc<str>> {
        if sql.len() > REWRITE_MAX_LEN {
            return numbered_placeholders(sql).map(Arc::from);
        }
        if let Some(r) = self.rewrites.get(sql) {
            return r.clone();
        }
        let r = numbered_placeholders(sql).map(Arc::from);
        if self.rewrites.len() >= REWRITE_CAP {
            self.rewrites.clear();
        }
        self.rewrites.insert(sql.to_string(), r.clone());
        r
    }

    /// Bind `params`: by number when the statement's placeholders were
    /// rewritten ([`numbered_placeholders`]). Else slot by slot: a slot
    /// whose name starts with `$n` (`$2`, `$1::text`) takes the n-th
    /// value, any other (`?`, `:name`) the value of its own position.
    fn bind(
        stmt: &mut rusqlite::Statement<'_>,
        params: &[SqlValue],
        by_number: bool,
    ) -> Result<(), DbError> {
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
        for slot in 1..=expected {
            let n = match (!by_number).then(|| stmt.parameter_name(slot)).flatten() {
                Some(name) => name
                    .strip_prefix('$')
                    .map(|rest| {
                        let end = rest
                            .find(|c: char| !c.is_ascii_digit())
                            .unwrap_or(rest.len());
                        &rest[..end]
                    })
                    .and_then(|d| d.parse::<usize>().ok())
                    .filter(|n| (1..=params.len()).contains(n))
                    .unwrap_or(slot),
                _ => slot,
            };
            let r = match &params[n - 1] {
                SqlValue::Null => stmt.raw_bind_parameter(slot, rusqlite::types::Null),
                SqlValue::Integer(v) => stmt.raw_bind_parameter(slot, v),
                SqlValue::Real(v) => stmt.raw_bind_parameter(slot, v),
                SqlValue::Text(v) => stmt.raw_bind_parameter(slot, v),
                SqlValue::Blob(v) => stmt.raw_bind_parameter(slot, v),
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

    fn enter_plugin_window(
        &mut self,
        limit: Option<std::time::Duration>,
        _role: Option<&str>,
    ) -> Result<(), DbError> {
        self.limit = limit;
        Ok(())
    }

    fn leave_plugin_window(&mut self) -> Result<(), DbError> {
        self.limit = None;
        Ok(())
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
    let mut budget = RowBudget::default();
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
        budget.take(vals.iter().map(SqlValue::size).sum())?;
        out.push(vals);
    }
    Ok(QueryRows { columns, rows: out })
}
