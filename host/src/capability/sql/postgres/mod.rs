//! The PostgreSQL backend (the `tokio-postgres` client, driven by a
//! current-thread runtime of its own, as the blocking `postgres` crate
//! does): prepared statements cached per connection, values bound to
//! whatever type the server inferred for each placeholder, and the rows
//! of an `execute-batch` pipelined (every row's request is sent before
//! the first answer is read, instead of one round trip per row).

use std::collections::HashMap;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::task::Poll;

use futures_util::StreamExt as _;
use tokio_postgres::types::{ToSql, Type};

use super::{Backend, DbError, Dialect, QueryRows, RowBudget, SqlValue};

mod bind;
pub(super) use bind::binds_in_binary;

pub(super) struct Postgres {
    // Dropped before `rt`, which then lets the connection end cleanly.
    client: tokio_postgres::Client,
    statements: HashMap<String, tokio_postgres::Statement>,
    rt: Driver,
}

/// The runtime that runs the connection task, only while a call waits in
/// [`Driver::block_on`]. Dropped after the client, it drives the task to
/// its end (the protocol's Terminate, then the socket closes), so the
/// server logs no "unexpected EOF on client connection".
struct Driver {
    rt: tokio::runtime::Runtime,
    connection: Option<tokio::task::JoinHandle<()>>,
}

impl Driver {
    fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        if let Some(task) = self.connection.take() {
            // The timer is made inside the runtime, which it needs.
            let _ = self.rt.block_on(async {
                tokio::time::timeout(std::time::Duration::from_secs(1), task).await
            });
        }
    }
}

fn pg_err(e: tokio_postgres::Error) -> DbError {
    // A value the host refused to bind: a data exception of its own.
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        if let Some(r) = s.downcast_ref::<bind::Refused>() {
            return DbError {
                message: format!("{e}: {r}"),
                code: r.code.to_string(),
            };
        }
        source = s.source();
    }
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

impl Postgres {
    /// Connect to `url`; a URL without a password takes one from
    /// `password_file`, `PGPASSWORD` or the password file
    /// ([`super::password::find`]).
    pub(super) fn connect(url: &str, password_file: Option<&Path>) -> Result<Self, DbError> {
        let mut config: tokio_postgres::Config = url.parse().map_err(pg_err)?;
        if config.get_password().is_none()
            && let Some(user) = config.get_user().map(str::to_string)
        {
            let host = match config.get_hosts().first() {
                Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
                // libpq matches a Unix socket as `localhost`.
                _ => "localhost".to_string(),
            };
            let port = config.get_ports().first().copied().unwrap_or(5432);
            let db = config.get_dbname().unwrap_or(&user).to_string();
            if let Some(pw) = super::password::find(password_file, &host, port, &db, &user)? {
                config.password(pw);
            }
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| DbError::host(format!("cannot start the PostgreSQL client: {e}")))?;
        let (client, connection) = rt
            .block_on(config.connect(tokio_postgres::NoTls))
            .map_err(pg_err)?;
        // Its error (a lost connection) reaches the next call as well.
        let connection = rt.spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("PostgreSQL connection ended: {e}");
            }
        });
        Ok(Postgres {
            client,
            statements: HashMap::new(),
            rt: Driver {
                rt,
                connection: Some(connection),
            },
        })
    }

    fn statement(&mut self, sql: &str) -> Result<tokio_postgres::Statement, DbError> {
        if let Some(s) = self.statements.get(sql) {
            return Ok(s.clone());
        }
        let s = self.rt.block_on(self.client.prepare(sql)).map_err(pg_err)?;
        if self.statements.len() > 256 {
            self.statements.clear();
        }
        self.statements.insert(sql.to_string(), s.clone());
        Ok(s)
    }

    fn params(params: &[SqlValue]) -> impl ExactSizeIterator<Item = &(dyn ToSql + Sync)> {
        params.iter().map(|p| p as &(dyn ToSql + Sync))
    }
}

/// Await `futures` polling every one of them first in index order, then
/// only the earliest unfinished one. tokio-postgres sends a request when
/// its future is first polled and answers come back in the order sent,
/// so this sends them all in order before waiting for any (a pipeline)
/// and finishes them in order.
async fn in_order<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    let mut first = true;
    let mut next = 0;
    std::future::poll_fn(|cx| {
        if std::mem::take(&mut first) {
            // A row whose values cannot be bound fails here, unsent.
            for (f, out) in futures.iter_mut().zip(outs.iter_mut()) {
                if let Poll::Ready(o) = f.as_mut().poll(cx) {
                    *out = Some(o);
                }
            }
        }
        while next < futures.len() {
            if outs[next].is_none() {
                match futures[next].as_mut().poll(cx) {
                    Poll::Ready(o) => outs[next] = Some(o),
                    Poll::Pending => return Poll::Pending,
                }
            }
            next += 1;
        }
        Poll::Ready(())
    })
    .await;
    outs.into_iter().flatten().collect()
}

fn pg_value(row: &tokio_postgres::Row, i: usize) -> Result<SqlValue, DbError> {
    let ty = row.columns()[i].type_().clone();
    let conv = |e: tokio_postgres::Error| DbError {
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
        self.rt
            .block_on(self.client.batch_execute(sql))
            .map_err(pg_err)
    }

    fn execute(&mut self, sql: &str, params: &[SqlValue]) -> Result<u64, DbError> {
        let stmt = self.statement(sql)?;
        self.rt
            .block_on(self.client.execute_raw(&stmt, Self::params(params)))
            .map_err(pg_err)
    }

    fn execute_many(
        &mut self,
        sql: &str,
        rows: &[Vec<SqlValue>],
    ) -> Result<Vec<u64>, (usize, DbError)> {
        let stmt = self.statement(sql).map_err(|e| (0, e))?;
        let client = &self.client;
        let requests = rows
            .iter()
            .map(|params| client.execute_raw(&stmt, Self::params(params)))
            .collect();
        // After a failed row the server refuses the rest (the transaction
        // is aborted, 25P02); the first error is the one to report.
        self.rt
            .block_on(in_order(requests))
            .into_iter()
            .enumerate()
            .map(|(i, r)| r.map_err(|e| (i, pg_err(e))))
            .collect()
    }

    fn query(&mut self, sql: &str, params: &[SqlValue]) -> Result<QueryRows, DbError> {
        let stmt = self.statement(sql)?;
        let columns: Vec<String> = stmt
            .columns()
            .iter()
            .map(|c| c.name().to_string())
            .collect();
        // Streamed, so a huge result stops at the caps instead of being
        // collected first.
        let cancel = self.client.cancel_token();
        let rows = self
            .rt
            .block_on(self.client.query_raw(&stmt, Self::params(params)))
            .map_err(pg_err)?;
        let mut rows = std::pin::pin!(rows);
        let mut out = Vec::new();
        let mut budget = RowBudget::default();
        while let Some(row) = self.rt.block_on(rows.next()).transpose().map_err(pg_err)? {
            let vals = (0..columns.len())
                .map(|i| pg_value(&row, i))
                .collect::<Result<Vec<_>, _>>()?;
            if let Err(e) = budget.take(vals.iter().map(SqlValue::size).sum()) {
                // Stop the server producing the rest: dropping the stream
                // would otherwise read it to its end (perhaps never).
                if let Err(c) = self.rt.block_on(cancel.cancel_query(tokio_postgres::NoTls)) {
                    tracing::warn!("cancelling an oversized query failed: {c}");
                }
                return Err(e);
            }
            out.push(vals);
        }
        Ok(QueryRows { columns, rows: out })
    }

    fn copy_in(
        &mut self,
        table: &str,
        columns: &[String],
        stand_in: &[Option<String>],
        rows: &[Vec<SqlValue>],
    ) -> Result<u64, (usize, DbError)> {
        let cols = columns.join(", ");
        // The columns' types, from a prepared (never run) query.
        let types: Vec<Type> = self
            .statement(&format!("SELECT {cols} FROM {table}"))
            .map_err(|e| (0, e))?
            .columns()
            .iter()
            .map(|c| c.type_().clone())
            .collect();
        let copy = format!("COPY {table} ({cols}) FROM STDIN (FORMAT binary)");
        let client = &self.client;
        let mut at = 0;
        let loaded = self.rt.block_on(async {
            let sink = client.copy_in(&copy).await?;
            let writer = tokio_postgres::binary_copy::BinaryCopyInWriter::new(sink, &types);
            let mut writer = std::pin::pin!(writer);
            for (i, row) in rows.iter().enumerate() {
                at = i;
                let fields = row.iter().zip(stand_in).map(|(value, s)| bind::Field {
                    value,
                    stand_in: s.as_deref(),
                });
                writer.as_mut().write_raw(fields).await?;
            }
            at = 0;
            writer.as_mut().finish().await
        });
        loaded.map_err(|e| {
            // The server names the row it refused in its context:
            // "COPY t, line N, column c: …" (line 1 is the first row).
            let line = e
                .as_db_error()
                .and_then(|d| d.where_())
                .and_then(|w| w.split(", line ").nth(1))
                .and_then(|l| l.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|n| n.parse::<usize>().ok());
            (line.map_or(at, |n| n.saturating_sub(1)), pg_err(e))
        })
    }

    fn in_autocommit(&self) -> Option<bool> {
        None
    }

    fn enter_plugin_window(
        &mut self,
        limit: Option<std::time::Duration>,
        role: Option<&str>,
    ) -> Result<(), DbError> {
        // SET LOCAL: both end with the transaction in any case. A lock
        // wait gives up at half the statement limit with its own SQLSTATE
        // (55P03, retried by the driver) instead of ending as a timeout.
        let ms = limit.map_or(0, |d| d.as_millis().max(1));
        let lock_ms = if ms == 0 { 0 } else { (ms / 2).max(1) };
        let mut sql =
            format!("SET LOCAL statement_timeout = {ms}; SET LOCAL lock_timeout = {lock_ms}");
        if let Some(role) = role {
            sql.push_str(&format!(
                "; SET LOCAL ROLE {}",
                sluice_guest::sql::quoted(role)
            ));
        }
        self.batch(&sql)
    }

    fn leave_plugin_window(&mut self) -> Result<(), DbError> {
        // RESET, not NONE: back to the login's own default role, which may
        // be configured (`ALTER ROLE login SET role = …`).
        self.batch("SET LOCAL statement_timeout = 0; SET LOCAL lock_timeout TO DEFAULT; RESET ROLE")
    }

    fn transaction_mark(&mut self) -> Result<Option<String>, DbError> {
        // The settings too: a function a plugin statement reaches (a
        // trigger, a default) could lift the time bound or move the
        // search path the host's own function names resolve through.
        let rows = self.query(
            "SELECT 'transaction ' || txid_current()::text || ', role ' || current_user::text \
               || ', statement_timeout ' || current_setting('statement_timeout') \
               || ', lock_timeout ' || current_setting('lock_timeout') \
               || ', search_path ' || current_setting('search_path')",
            &[],
        )?;
        match rows.rows.first().and_then(|r| r.first()) {
            Some(SqlValue::Text(mark)) => Ok(Some(mark.clone())),
            other => Err(DbError::host(format!(
                "unexpected answer {other:?} to the transaction check"
            ))),
        }
    }

    fn blob_type(&self) -> &'static str {
        "BYTEA"
    }
}
