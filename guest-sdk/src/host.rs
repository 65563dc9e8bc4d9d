//! The host imports (`log`, `config`, `sql`, `kafka`) behind a trait, so the same plugin
//! code runs inside a component (where the generated bindings implement it)
//! and natively (where a stderr logger and an empty config stand in).

use std::sync::OnceLock;

use crate::kafka::record::OutputRecord;
use crate::sql::types::{BatchError, Change, Rows, SqlError, Value, not_granted};

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
    /// Run one statement per parameter row. The default calls
    /// [`HostApi::sql_execute`] for each row, stopping at the first error.
    fn sql_execute_batch(&self, statement: &str, rows: &[&[Value]]) -> Result<u64, BatchError> {
        let mut changed = 0;
        for (row, params) in rows.iter().enumerate() {
            changed += self
                .sql_execute(statement, params)
                .map_err(|error| BatchError { row, error })?;
        }
        Ok(changed)
    }
    /// Apply a table's changes (`sql.apply`): `table`, its `columns` and
    /// `key` columns as [`crate::sql::Table::new`] checked them; with
    /// `version` (the version column and the low version),
    /// `sql.apply-versioned`.
    fn sql_apply(
        &self,
        table: &str,
        columns: &[String],
        key: &[String],
        version: Option<(&str, Value)>,
        changes: Vec<Change>,
    ) -> Result<u64, BatchError> {
        let _ = (table, columns, key, version, changes);
        Err(BatchError {
            row: 0,
            error: not_granted(),
        })
    }
    /// Run one query.
    fn sql_query(&self, statement: &str, params: &[Value]) -> Result<Rows, SqlError> {
        let _ = (statement, params);
        Err(not_granted())
    }
    /// Queue records for production (`kafka.send`).
    fn kafka_send(&self, records: Vec<OutputRecord>) -> Result<(), String> {
        let _ = records;
        Err("no kafka capability granted (outside a sink stage in the host)".into())
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Fails the statement for the row whose first value is "bad".
    #[derive(Default)]
    struct Recording(Mutex<Vec<Vec<Value>>>);

    impl HostApi for Recording {
        fn log(&self, _level: LogLevel, _message: &str) {}
        fn config_all(&self) -> Vec<(String, String)> {
            Vec::new()
        }
        fn sql_execute(&self, _statement: &str, params: &[Value]) -> Result<u64, SqlError> {
            if params.first() == Some(&Value::from("bad")) {
                return Err(SqlError {
                    message: "refused".into(),
                    code: "23505".into(),
                });
            }
            self.0.lock().unwrap().push(params.to_vec());
            Ok(1)
        }
    }

    #[test]
    fn the_default_batch_runs_rows_in_order_and_stops_at_the_failing_one() {
        let host = Recording::default();
        let rows = [
            vec![Value::from("a")],
            vec![Value::from("b")],
            vec![Value::from("bad")],
            vec![Value::from("c")],
        ];
        let views: Vec<&[Value]> = rows.iter().map(Vec::as_slice).collect();
        assert_eq!(host.sql_execute_batch("S", &views[..2]), Ok(2));
        let e = host.sql_execute_batch("S", &views[2..]).unwrap_err();
        assert_eq!(e.row, 0);
        assert_eq!(e.error.code, "23505");
        let e = host.sql_execute_batch("S", &views).unwrap_err();
        assert_eq!(e.row, 2);
        assert_eq!(
            *host.0.lock().unwrap(),
            vec![
                vec![Value::from("a")],
                vec![Value::from("b")],
                vec![Value::from("a")],
                vec![Value::from("b")],
            ],
            "row 3 never ran"
        );
        assert_eq!(e.to_string(), "row 2: refused (23505)");
    }
}
