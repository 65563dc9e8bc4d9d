//! The host side of the WIT imports a plugin instance sees (`wit/`):
//! `log` (into the host's tracing, tagged with the plugin), `config` (the
//! pipeline's `--config` pairs) and `sql` (the session granted by
//! [`crate::capability::sql`]), implemented on the store data.
//!
//! This file only converts between the generated binding types and the
//! host's: the capability's state and rules live in `capability::sql`, so
//! the bindings stay private to `plugin` (STYLE.md).

use wasmtime::Engine;
use wasmtime::component::{HasSelf, Linker};
use wasmtime_wasi::{WasiCtxView, WasiView};

use super::bindings::sluice::plugin::{config, log, sql, types};
use super::instance::State;
use super::{LOG_LINE_BYTES, LOG_LINES_PER_CALL};
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

/// What a plugin instance may still write into the host's log in the
/// current call: [`LOG_LINES_PER_CALL`] lines of at most [`LOG_LINE_BYTES`]
/// bytes; the rest are counted.
#[derive(Debug, Default)]
pub(crate) struct LogBudget {
    used: u32,
    dropped: u64,
}

impl LogBudget {
    /// `line` (cut to the length limit) if the call may still log one.
    pub(crate) fn admit<'a>(&mut self, line: &'a str) -> Option<&'a str> {
        if self.used >= LOG_LINES_PER_CALL {
            self.dropped += 1;
            return None;
        }
        self.used += 1;
        let mut end = line.len().min(LOG_LINE_BYTES);
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        Some(&line[..end])
    }

    /// End of a call: log how many lines were dropped, and start afresh.
    pub(crate) fn end_call(&mut self, plugin: &str) {
        if self.dropped > 0 {
            tracing::warn!(
                plugin,
                dropped = self.dropped,
                "{} plugin log lines dropped in one call (at most {LOG_LINES_PER_CALL} lines of {LOG_LINE_BYTES} bytes per call)",
                self.dropped
            );
        }
        *self = LogBudget::default();
    }
}

impl log::Host for State {
    fn log(&mut self, level: log::Level, message: String) {
        let Some(message) = self.log.admit(&message) else {
            return;
        };
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

/// The sandboxed linker: WASI p2 (sync) plus the Sluice host imports.
pub(crate) fn linker(engine: &Engine) -> wasmtime::Result<Linker<State>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_sync(&mut linker)?;
    types::add_to_linker::<State, HasSelf<State>>(&mut linker, |s| s)?;
    log::add_to_linker::<State, HasSelf<State>>(&mut linker, |s| s)?;
    config::add_to_linker::<State, HasSelf<State>>(&mut linker, |s| s)?;
    sql::add_to_linker::<State, HasSelf<State>>(&mut linker, |s| s)?;
    Ok(linker)
}
