//! The host side of the WIT imports a plugin instance sees (`wit/`):
//! `log` (into the host's tracing, tagged with the plugin), `config` (the
//! pipeline's `--config` pairs), `sql` (the session granted by
//! [`crate::capability::sql`]) and `kafka` (the outbox of
//! [`crate::capability::kafka`]), implemented on the store data; and WASI's
//! `wasi:clocks/monotonic-clock` with sleeps held to the call's deadline
//! ([`DeadlineClock`]).
//!
//! This file only converts between the generated binding types and the
//! host's: the capability's state and rules live in `capability::sql`, so
//! the bindings stay private to `plugin` (STYLE.md).

use std::time::{Duration, Instant};

use wasmtime::Engine;
use wasmtime::component::{HasData, HasSelf, Linker, Resource};
use wasmtime_wasi::clocks::{WasiClocksCtxView, WasiClocksView};
use wasmtime_wasi::p2::DynPollable;
use wasmtime_wasi::p2::bindings::clocks::monotonic_clock;
use wasmtime_wasi::{WasiCtxView, WasiView};

use super::bindings::sluice::plugin::{config, kafka, log, sql, types};
use super::error::WaitPastDeadline;
use super::instance::State;
use crate::capability::sql::{DbError, SqlValue, bulk};

impl WasiView for State {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl types::Host for State {}

impl log::Host for State {
    fn log(&mut self, level: log::Level, message: String) {
        let mut budget = self.log.lock().unwrap_or_else(|p| p.into_inner());
        let Some(message) = budget.admit(&message, Instant::now()) else {
            return;
        };
        drop(budget);
        let plugin = self.plugin.as_str();
        match level {
            log::Level::Trace => tracing::trace!(plugin, "{message}"),
            log::Level::Debug => tracing::debug!(plugin, "{message}"),
            log::Level::Info => tracing::info!(plugin, "{message}"),
            log::Level::Warn => tracing::warn!(plugin, "{message}"),
            log::Level::Error => tracing::error!(plugin, "{message}"),
        }
    }
}

impl config::Host for State {
    fn get(&mut self, key: String) -> Option<String> {
        self.config.get(&key).cloned()
    }

    fn get_all(&mut self) -> Vec<(String, String)> {
        self.config
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

fn to_sql_value(v: sql::Value) -> SqlValue {
    match v {
        sql::Value::Null => SqlValue::Null,
        sql::Value::Integer(i) => SqlValue::Integer(i),
        sql::Value::Real(r) => SqlValue::Real(r),
        sql::Value::Text(t) => SqlValue::Text(t),
        sql::Value::Blob(b) => SqlValue::Blob(b),
    }
}

fn from_sql_value(v: SqlValue) -> sql::Value {
    match v {
        SqlValue::Null => sql::Value::Null,
        SqlValue::Integer(i) => sql::Value::Integer(i),
        SqlValue::Real(r) => sql::Value::Real(r),
        SqlValue::Text(t) => sql::Value::Text(t),
        SqlValue::Blob(b) => sql::Value::Blob(b),
    }
}

fn sql_error(e: DbError) -> sql::SqlError {
    sql::SqlError {
        message: e.message,
        code: e.code,
    }
}

impl State {
    /// `sql.apply`, or `sql.apply-versioned` with `version` (the version
    /// column and the low version), through the grant's bulk path.
    fn apply_to(
        &mut self,
        target: sql::Target,
        version: Option<(String, SqlValue)>,
        changes: Vec<sql::Change>,
    ) -> Result<u64, sql::BatchError> {
        let batch_error = |row: usize, e: DbError| sql::BatchError {
            // A list lifted from the guest has fewer than 2^32 changes.
            row: u32::try_from(row).unwrap_or(u32::MAX),
            error: sql_error(e),
        };
        let Some(g) = &self.sql else {
            return Err(batch_error(0, not_granted()));
        };
        let changes = changes
            .into_iter()
            .map(|c| match c {
                sql::Change::Upsert(v) => {
                    bulk::Change::Upsert(v.into_iter().map(to_sql_value).collect())
                }
                sql::Change::Delete(v) => {
                    bulk::Change::Delete(v.into_iter().map(to_sql_value).collect())
                }
            })
            .collect();
        let version = version.as_ref().map(|(c, low)| (c.as_str(), low.clone()));
        g.plugin_apply(
            (&target.table, &target.columns, &target.key),
            version,
            changes,
        )
        .map_err(|(row, e)| batch_error(row, e))
    }
}

impl sql::Host for State {
    fn dialect(&mut self) -> String {
        self.sql
            .as_ref()
            .map_or("none", |g| g.dialect().name())
            .to_string()
    }

    fn execute(
        &mut self,
        statement: String,
        params: Vec<sql::Value>,
    ) -> Result<u64, sql::SqlError> {
        let Some(g) = &self.sql else {
            return Err(sql_error(not_granted()));
        };
        let params: Vec<SqlValue> = params.into_iter().map(to_sql_value).collect();
        g.plugin_execute(&statement, &params).map_err(sql_error)
    }

    fn execute_batch(
        &mut self,
        statement: String,
        rows: Vec<Vec<sql::Value>>,
    ) -> Result<u64, sql::BatchError> {
        let Some(g) = &self.sql else {
            return Err(sql::BatchError {
                row: 0,
                error: sql_error(not_granted()),
            });
        };
        let rows: Vec<Vec<SqlValue>> = rows
            .into_iter()
            .map(|r| r.into_iter().map(to_sql_value).collect())
            .collect();
        g.plugin_execute_batch(&statement, &rows)
            .map_err(|(row, e)| sql::BatchError {
                // A list lifted from the guest has fewer than 2^32 rows.
                row: u32::try_from(row).unwrap_or(u32::MAX),
                error: sql_error(e),
            })
    }

    fn apply(
        &mut self,
        target: sql::Target,
        changes: Vec<sql::Change>,
    ) -> Result<u64, sql::BatchError> {
        self.apply_to(target, None, changes)
    }

    fn apply_versioned(
        &mut self,
        target: sql::Target,
        guard: sql::VersionGuard,
        changes: Vec<sql::Change>,
    ) -> Result<u64, sql::BatchError> {
        let low = to_sql_value(guard.low);
        self.apply_to(target, Some((guard.column, low)), changes)
    }

    fn query(
        &mut self,
        statement: String,
        params: Vec<sql::Value>,
    ) -> Result<sql::Rows, sql::SqlError> {
        let Some(g) = &self.sql else {
            return Err(sql_error(not_granted()));
        };
        let params: Vec<SqlValue> = params.into_iter().map(to_sql_value).collect();
        let rows = g.plugin_query(&statement, &params).map_err(sql_error)?;
        Ok(sql::Rows {
            columns: rows.columns,
            rows: rows
                .rows
                .into_iter()
                .map(|r| r.into_iter().map(from_sql_value).collect())
                .collect(),
        })
    }
}

impl kafka::Host for State {
    fn send(&mut self, records: Vec<kafka::OutputRecord>) -> Result<(), String> {
        let records = records
            .into_iter()
            .map(|r| crate::capability::kafka::Sent {
                topic: r.topic,
                partition: r.partition,
                key: r.key,
                value: r.value,
                headers: r.headers.into_iter().map(|h| (h.key, h.value)).collect(),
                idempotency_key: r.idempotency_key,
            })
            .collect();
        self.outbox.send(self.kafka.as_deref(), records)
    }
}

fn not_granted() -> DbError {
    DbError {
        message: "no sql capability granted (configure the pipeline with --sink-db)".into(),
        code: "sluice".into(),
    }
}

/// `wasi:clocks/monotonic-clock` as WASI's own, except that a timer ending
/// past the current call's deadline (`State::deadline`) traps with
/// [`WaitPastDeadline`] at once: served, it would block the host thread
/// for its whole length whatever the deadline (the epoch interruption
/// behind `--plugin-timeout` only stops running guest code).
pub(crate) struct DeadlineClock<'a> {
    inner: WasiClocksCtxView<'a>,
    deadline: Option<Instant>,
}

impl DeadlineClock<'_> {
    fn check(&self, asked: Duration) -> wasmtime::Result<()> {
        if let Some(deadline) = self.deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            if asked > left {
                return Err(WaitPastDeadline { asked, left }.into());
            }
        }
        Ok(())
    }
}

struct DeadlineClocks;

impl HasData for DeadlineClocks {
    type Data<'a> = DeadlineClock<'a>;
}

impl monotonic_clock::Host for DeadlineClock<'_> {
    fn now(&mut self) -> wasmtime::Result<monotonic_clock::Instant> {
        self.inner.now()
    }

    fn resolution(&mut self) -> wasmtime::Result<monotonic_clock::Duration> {
        self.inner.resolution()
    }

    fn subscribe_instant(
        &mut self,
        when: monotonic_clock::Instant,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        let now = self.inner.now()?;
        self.check(Duration::from_nanos(when.saturating_sub(now)))?;
        self.inner.subscribe_instant(when)
    }

    fn subscribe_duration(
        &mut self,
        duration: monotonic_clock::Duration,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        self.check(Duration::from_nanos(duration))?;
        self.inner.subscribe_duration(duration)
    }
}

/// The sandboxed linker: WASI p2 (sync), with [`DeadlineClock`] in place
/// of WASI's monotonic clock, plus the Sluice host imports.
pub(crate) fn linker(engine: &Engine) -> wasmtime::Result<Linker<State>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_sync(&mut linker)?;
    linker.allow_shadowing(true);
    monotonic_clock::add_to_linker::<State, DeadlineClocks>(&mut linker, |s| {
        let deadline = s.deadline;
        DeadlineClock {
            inner: s.clocks(),
            deadline,
        }
    })?;
    linker.allow_shadowing(false);
    types::add_to_linker::<State, HasSelf<State>>(&mut linker, |s| s)?;
    log::add_to_linker::<State, HasSelf<State>>(&mut linker, |s| s)?;
    config::add_to_linker::<State, HasSelf<State>>(&mut linker, |s| s)?;
    sql::add_to_linker::<State, HasSelf<State>>(&mut linker, |s| s)?;
    kafka::add_to_linker::<State, HasSelf<State>>(&mut linker, |s| s)?;
    Ok(linker)
}
