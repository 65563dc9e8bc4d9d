//! The host side of the WIT imports a plugin instance sees (`wit/`):
//! `log` (into the host's tracing, tagged with the plugin), `config` (the
//! pipeline's `--config` pairs) and `sql` (the session granted by
//! [`crate::capability::sql`]), implemented on the store data; and WASI's
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

use super::bindings::sluice::plugin::{config, log, sql, types};
use super::instance::State;
use super::{LOG_LINE_BYTES, LOG_LINES_PER_CALL, LOG_LINES_PER_SECOND};
use crate::capability::sql::{DbError, SqlValue};

impl WasiView for State {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl types::Host for State {}

/// What a plugin instance may still write into the host's log: in the
/// current call [`LOG_LINES_PER_CALL`] lines, and in the current second
/// [`LOG_LINES_PER_SECOND`], of at most [`LOG_LINE_BYTES`] bytes each; the
/// rest are counted and reported in one line at most once a second (and
/// when the instance goes). One budget per [`super::Instance`], kept over
/// the fresh stores that follow traps.
#[derive(Debug)]
pub(crate) struct LogBudget {
    plugin: String,
    used: u32,
    /// Start of the current second and the lines written in it.
    second: Option<(Instant, u32)>,
    /// Dropped since the last report, and when that was.
    dropped: u64,
    reported: Option<Instant>,
}

/// A [`LogBudget`] shared by an instance and its stores.
pub(crate) type SharedLogBudget = std::sync::Arc<std::sync::Mutex<LogBudget>>;

impl LogBudget {
    /// A fresh budget for `plugin` (its short digest, as logged).
    pub(crate) fn shared(plugin: &str) -> SharedLogBudget {
        std::sync::Arc::new(std::sync::Mutex::new(LogBudget {
            plugin: plugin.to_string(),
            used: 0,
            second: None,
            dropped: 0,
            reported: None,
        }))
    }

    /// `line` (cut to the length limit) if it may still be logged at `now`.
    pub(crate) fn admit<'a>(&mut self, line: &'a str, now: Instant) -> Option<&'a str> {
        let second = match self.second {
            Some((start, n)) if now.duration_since(start) < Duration::from_secs(1) => (start, n),
            _ => (now, 0),
        };
        if self.used >= LOG_LINES_PER_CALL || second.1 >= LOG_LINES_PER_SECOND {
            self.second = Some(second);
            self.dropped += 1;
            return None;
        }
        self.used += 1;
        self.second = Some((second.0, second.1 + 1));
        let mut end = line.len().min(LOG_LINE_BYTES);
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        Some(&line[..end])
    }

    /// End of a call at `now`: the next call's count starts (the second's
    /// goes on); dropped lines are reported if a second has passed since
    /// the last report. Returns the count reported, if any.
    pub(crate) fn end_call(&mut self, now: Instant) -> Option<u64> {
        self.used = 0;
        let due = self
            .reported
            .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1));
        if self.dropped == 0 || !due {
            return None;
        }
        self.report();
        self.reported = Some(now);
        Some(std::mem::take(&mut self.dropped))
    }

    fn report(&self) {
        if self.dropped > 0 {
            tracing::warn!(
                plugin = self.plugin.as_str(),
                dropped = self.dropped,
                "{} plugin log lines dropped (at most {LOG_LINES_PER_CALL} lines per call and {LOG_LINES_PER_SECOND} per second, of {LOG_LINE_BYTES} bytes)",
                self.dropped
            );
        }
    }
}

impl Drop for LogBudget {
    fn drop(&mut self) {
        self.report();
    }
}

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

fn not_granted() -> DbError {
    DbError {
        message: "no sql capability granted (configure the pipeline with --sink-db)".into(),
        code: "sluice".into(),
    }
}

/// The trap of a call that asked WASI to wait past the call's deadline
/// (a sleep, or a timer it polls): the epoch deadline cannot interrupt a
/// host call, so the wait is refused when it is asked for, not served.
#[derive(Debug)]
pub(crate) struct WaitPastDeadline {
    /// The wait asked for.
    pub(crate) asked: Duration,
    /// What was left of the call's deadline.
    pub(crate) left: Duration,
}

impl std::fmt::Display for WaitPastDeadline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "a WASI sleep of {} ms would pass the call's deadline ({} ms left)",
            self.asked.as_millis(),
            self.left.as_millis()
        )
    }
}

impl std::error::Error for WaitPastDeadline {}

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
    Ok(linker)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_are_capped_per_call_and_per_second_and_drops_reported_once_a_second() {
        let shared = LogBudget::shared("p");
        let mut b = shared.lock().unwrap();
        let t0 = Instant::now();
        let kept = (0..300).filter(|_| b.admit("x", t0).is_some()).count();
        assert_eq!(kept, LOG_LINES_PER_CALL as usize);
        assert_eq!(b.end_call(t0), Some(100));
        // Many short calls in the same second share the per-second cap,
        // and their drops wait for the next report.
        let mut total = kept;
        for i in 0..20 {
            let at = t0 + Duration::from_millis(i * 10);
            total += (0..100).filter(|_| b.admit("x", at).is_some()).count();
            assert_eq!(b.end_call(at), None, "at most one report a second");
        }
        assert_eq!(total, LOG_LINES_PER_SECOND as usize);
        let later = t0 + Duration::from_millis(1500);
        assert_eq!(b.end_call(later), Some(1200));
        assert!(b.admit("x", later).is_some(), "a new second, a new budget");
        // Long lines are cut at a character boundary.
        let long = "é".repeat(LOG_LINE_BYTES);
        let cut = b.admit(&long, later).unwrap();
        assert!(cut.len() <= LOG_LINE_BYTES && cut.chars().all(|c| c == 'é'));
    }
}
