//! The host imports (`log`, `config`) behind a trait, so the same plugin
//! code runs inside a component (where the generated bindings implement it)
//! and natively (where a stderr logger and an empty config stand in).

use std::sync::OnceLock;

use crate::sql::types::{Rows, SqlError, Value, not_granted};

/// Log severity, as in the WIT `log.level` enum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    /// Very detailed.
    Trace,
    /// Debugging detail.
    Debug,
    /// Normal operation.
    Info,
    /// Something unexpected that did not stop the stage.
    Warn,
    /// Something failed.
    Error,
}

/// What a plugin can ask of the host.
pub trait HostApi: Send + Sync {
    /// Emit a log line into the host's log stream.
    fn log(&self, level: LogLevel, message: &str);
    /// Every configured pair.
    fn config_all(&self) -> Vec<(String, String)>;
    /// The SQL dialect, when a connection is granted.
    fn sql_dialect(&self) -> Option<String> {
        None
    }
    /// Run one statement.
    fn sql_execute(&self, statement: &str, params: &[Value]) -> Result<u64, SqlError> {
        let _ = (statement, params);
        Err(not_granted())
    }
    /// Run one query.
    fn sql_query(&self, statement: &str, params: &[Value]) -> Result<Rows, SqlError> {
        let _ = (statement, params);
        Err(not_granted())
    }
}

struct NativeHost;

impl HostApi for NativeHost {
    fn log(&self, level: LogLevel, message: &str) {
        eprintln!("[{level:?}] {message}");
    }
    fn config_all(&self) -> Vec<(String, String)> {
        Vec::new()
    }
}

static HOST: OnceLock<Box<dyn HostApi>> = OnceLock::new();

/// Install the host implementation (done once by the generated code).
pub fn set_host(host: Box<dyn HostApi>) {
    let _ = HOST.set(host);
}

pub(crate) fn host() -> &'static dyn HostApi {
    HOST.get_or_init(|| Box::new(NativeHost)).as_ref()
}
