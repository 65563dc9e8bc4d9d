//! The session behind the capability ([`SqlGrant`]): one connection the
//! sink driver and the plugin's `sql` imports share, the transaction the
//! driver brackets each part in, and the checks every plugin statement
//! passes before it runs.
//!
//! Longer than 650 lines: one connection's state and every call that
//! touches it (driver, plugin, transaction) in one place; the statement
//! staging is apart (`staging`), splitting the rest would spread the
//! locking.

use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use super::guard::{Approved, REFUSED, first_keyword};

mod staging;
use super::url::connect_with;
use super::{Backend, DbError, Dialect, QueryRows, Ran, SqlValue, bulk, dry, guard};

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
    pub(super) approved: std::collections::HashMap<String, Approved>,
    /// The same for texts longer than [`APPROVED_MAX_LEN`] (a multi-row
    /// statement of thousands of values), by their SHA-256, so that
    /// neither their parse nor their bytes are repeated.
    pub(super) approved_long: std::collections::HashMap<[u8; 32], Approved>,
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
    /// The bulk path's staging tables this connection has
    /// ([`bulk::Stage`]; PostgreSQL), and those created in the open
    /// transaction (theirs only once it commits).
    stages: std::collections::HashSet<String>,
    new_stages: Vec<String>,
    /// Staging tables filled in the open transaction (emptied before
    /// another call fills them again; each commit empties them all).
    filled: Vec<String>,
    /// Why this connection cannot create a staging table (no TEMPORARY
    /// privilege, say): the bulk path keeps to statements on it.
    no_stage: Option<String>,
}

/// Most distinct statement texts remembered in [`Session::approved`] (and
/// as many in [`Session::approved_long`]).
pub(super) const APPROVED_CAP: usize = 256;
/// Longest statement text remembered as text, bytes (longer ones are
/// remembered by digest), so the cache holds at most
/// `APPROVED_CAP × (APPROVED_MAX_LEN + 32)` bytes whatever a plugin sends.
pub(super) const APPROVED_MAX_LEN: usize = 4096;

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
            stages: std::collections::HashSet::new(),
            new_stages: Vec::new(),
            filled: Vec::new(),
            no_stage: None,
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

    /// Whether this is a session with no database ([`SqlGrant::dry`]).
    pub fn is_dry(&self) -> bool {
        self.lock().dry
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
        s.stages.clear();
        s.new_stages.clear();
        s.filled.clear();
        // `no_stage` stays: the plugin role's privileges are the same on
        // the new connection (its warning is not repeated).
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
        self.lock().execute_batch(sql, rows)
    }

    /// A plugin's `apply` to `target` (table, columns, key columns: see
    /// [`bulk::Target::new`]), or its `apply-versioned` with `version`
    /// (the version column and the low version: see
    /// [`bulk::Target::versioned`]): the statements [`bulk::plan`] makes of
    /// `changes` (each key's last change, as multi-row statements), each
    /// run as the plugin's own `execute-batch` of it would be: checked,
    /// in the plugin's role, recorded by `host test`.
    ///
    /// # Errors
    /// The index in `changes` of the change that failed (the first change
    /// of the failing statement, also when the guard refused it; 0 for a
    /// bad target or outside a usable window) and its error; any of them
    /// aborts the range.
    pub fn plugin_apply(
        &self,
        target: (&str, &[String], &[String]),
        version: Option<(&str, SqlValue)>,
        changes: Vec<bulk::Change>,
    ) -> Result<u64, (usize, DbError)> {
        let mut s = self.lock();
        s.ready().map_err(|e| (0, e))?;
        let (table, columns, key) = target;
        let (target, folded) = bulk::Target::new(table, columns, key)
            .and_then(|t| match version {
                Some((column, low)) => t.versioned(column, low),
                None => Ok(t),
            })
            .map_err(|e| (0, e))
            .and_then(|t| bulk::fold(&t, changes).map(|f| (t, f)))
            .inspect_err(|(_, e)| s.failed = Some(e.clone()))?;
        let folded = match folded {
            bulk::Folded::Sets { deletes, upserts }
                if s.copy_allowed() && target.wants_copy(deletes.len() + upserts.len()) =>
            {
                let first = deletes.first().or(upserts.first()).map_or(0, |(i, _)| *i);
                match s.stage_for(&target).map_err(|e| (first, e))? {
                    Some(stage) => {
                        return s.apply_by_copy(&target.copy_plan(deletes, upserts, stage));
                    }
                    None => bulk::Folded::Sets { deletes, upserts },
                }
            }
            other => other,
        };
        let steps = bulk::statements(&target, folded);
        let mut changed = 0;
        for step in steps {
            changed += s
                .execute_batch(&step.sql, &step.rows)
                .map_err(|(i, e)| (step.origin.get(i).copied().unwrap_or_default(), e))?;
        }
        Ok(changed)
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

    /// `sql` once per parameter row of `rows`, in order, checked once;
    /// the total number of rows changed. Each row is run and recorded as
    /// its own `execute` would be.
    fn execute_batch(
        &mut self,
        sql: &str,
        rows: &[Vec<SqlValue>],
    ) -> Result<u64, (usize, DbError)> {
        let approved = self.approve(sql).map_err(|e| (0, e))?;
        // Row by row where each row must be checked after it runs
        // (`watch`) or recorded with its own outcome.
        if approved.watch || self.ran.is_some() {
            let mut changed = 0;
            for (i, params) in rows.iter().enumerate() {
                let r = self.run_approved(approved, |b| b.execute(sql, params));
                self.keep_ran(sql, params, false, r.as_ref().map(|n| *n));
                changed += r.map_err(|e| (i, e))?;
            }
            return Ok(changed);
        }
        let mut failed_row = 0;
        self.run_approved(approved, |b| {
            b.execute_many(sql, rows).map_err(|(i, e)| {
                failed_row = i;
                e
            })
        })
        .map(|counts| counts.iter().sum())
        .map_err(|e| (failed_row, e))
    }

    fn guarded<T>(
        &mut self,
        sql: &str,
        f: impl FnOnce(&mut dyn Backend) -> Result<T, DbError>,
    ) -> Result<T, DbError> {
        let approved = self.approve(sql)?;
        self.run_approved(approved, f)
    }

    /// Whether a plugin may use the connection now: inside a range
    /// whose transaction has not failed.
    fn ready(&self) -> Result<(), DbError> {
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
        Ok(())
    }

    /// Whether a plugin may run `sql` now: inside a range whose
    /// transaction has not failed, and passing [`Session::check`]
    /// (remembered per statement text).
    fn approve(&mut self, sql: &str) -> Result<Approved, DbError> {
        self.ready()?;
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
        self.new_stages.clear();
        self.filled.clear();
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
        let r = self.backend.batch("COMMIT");
        self.filled.clear();
        let created = std::mem::take(&mut self.new_stages);
        if r.is_ok() {
            self.stages.extend(created);
        }
        r
    }

    pub(crate) fn rollback(&mut self) {
        self.open = false;
        self.failed = None;
        self.mark = None;
        self.new_stages.clear();
        self.filled.clear();
        if let Err(e) = self.backend.batch("ROLLBACK") {
            // A lost connection rolled the transaction back already (and
            // the reconnect says so).
            if e.is_connection_lost() {
                tracing::debug!("rollback failed: {e}");
            } else {
                tracing::warn!("rollback failed: {e}");
            }
        }
    }
}
