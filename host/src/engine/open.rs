//! What opening a pipeline's store takes, for a checkpoint directory
//! (`ownership::sole::open`) and a group's tables (`ownership::member::join`)
//! alike: how the checkpoint is acquired ([`Acquire`]), the sink
//! database's connections ([`connect_sink`]), the refusal of a sink
//! another pipeline writes ([`refuse_shared_sink`]), and removing a new
//! checkpoint a refused start made ([`DiscardIfNew`]).

use std::time::Duration;

use crate::capability::sql::{self, SqlGrant};
use crate::checkpoint::Checkpoint;
use crate::sink::SinkDriver;

use super::{EngineError, PipelineConfig, shell_word};

/// How `run` acquires the checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Acquire {
    /// Fail at once (or queue with `--wait`) if another process owns it.
    #[default]
    Normal,
    /// Ask the owner to hand over, waiting at most this long for it.
    Takeover(Duration),
}

pub(super) fn sink_db_error(url: &str) -> impl FnOnce(sql::DbError) -> EngineError + '_ {
    move |error| EngineError::SinkDb {
        url: sql::redact(url),
        error,
    }
}

/// Until disarmed, removes a checkpoint this run created and planned
/// nothing in when dropped ([`Checkpoint::discard_if_unused`]): so every
/// `?` between opening a new checkpoint and running its first batch
/// leaves no directory behind.
pub(super) struct DiscardIfNew<'a>(pub(super) Option<&'a dyn Checkpoint>);

impl DiscardIfNew<'_> {
    /// The start went through: keep the checkpoint.
    pub(super) fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for DiscardIfNew<'_> {
    fn drop(&mut self) {
        if let Some(cp) = self.0.take() {
            cp.discard_if_unused();
        }
    }
}

/// Connect the sink database of `cfg` (if any) as the SQL capability,
/// with the statement limit, host schema and plugin role set: one
/// session per `--sink-connections` (none without a sink database).
///
/// # Errors
/// [`EngineError::SinkDb`].
pub(super) fn connect_sink(cfg: &PipelineConfig) -> Result<Vec<SqlGrant>, EngineError> {
    let Some(url) = cfg.sink_db.as_deref() else {
        return Ok(Vec::new());
    };
    let n = cfg.sink_connections.max(1);
    if n > 1 && !sql::is_postgres_url(url) {
        return Err(EngineError::Config(format!(
            "--sink-connections {n} is for a PostgreSQL --sink-db: SQLite lets one connection write at a time"
        )));
    }
    (0..n)
        .map(|i| {
            let g = SqlGrant::connect_with(url, cfg.sink_db_password_file.as_deref())
                .and_then(|g| {
                    g.limit_statements(cfg.limits.call_timeout)?;
                    g.set_host_schema(cfg.sink_schema.clone())?;
                    g.set_plugin_role(cfg.sink_plugin_role.clone())?;
                    Ok(g)
                })
                .map_err(|mut e| {
                    if n > 1 {
                        // Connections past the server's max_connections
                        // (53300) fail here, not the first.
                        e.message = format!(
                            "{} (connection {} of {n}, --sink-connections; each is a server backend, counted against max_connections)",
                            e.message,
                            i + 1
                        );
                    }
                    e
                })
                .map_err(sink_db_error(url))?;
            Ok(g)
        })
        .collect()
}

/// Refuse to start when the sink database holds another pipeline's
/// progress on our topics ([`SinkDriver::other_pipelines`]): two
/// checkpoints on one sink would both apply every record.
pub(super) fn refuse_shared_sink(
    cfg: &PipelineConfig,
    driver: &SinkDriver,
    query_id: &str,
) -> Result<(), EngineError> {
    let url = cfg.sink_db.as_deref().map(|u| {
        sql::sink_identity_in(u, cfg.sink_schema.as_deref()).unwrap_or_else(|_| sql::redact(u))
    });
    let others = driver
        .other_pipelines(query_id, &cfg.topics)
        .map_err(EngineError::Sink)?;
    if others.is_empty() {
        return Ok(());
    }
    let described: Vec<String> = others
        .iter()
        .map(|o| {
            format!(
                "query id {} on topic {} ({} partitions, last written {}{})",
                o.query_id,
                o.topic,
                o.partitions,
                crate::util::rfc3339_ms(o.updated_at_ms),
                if o.owner.is_empty() {
                    " by a host that did not record its checkpoint".to_string()
                } else {
                    format!(" by {}", o.owner)
                }
            )
        })
        .collect();
    let mut ids: Vec<&str> = others.iter().map(|o| o.query_id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    // The same pipeline in the other store (the owner each row records:
    // `…, checkpoint DIR` or `…, group NAME`): say how to move it here.
    let db = shell_word(
        cfg.sink_db
            .as_deref()
            .map(sql::redact)
            .as_deref()
            .unwrap_or("URL"),
    );
    let moving: Vec<String> = others
        .iter()
        .filter_map(|o| match &cfg.group {
            Some(group) => o.owner.rsplit_once(", checkpoint ").map(|(_, dir)| {
                format!(
                    "If that is this pipeline before it became a group, stop it and run `host group adopt --sink-db {db} --group {} --checkpoint {}` to make it group {group} exactly once. ",
                    shell_word(group),
                    shell_word(dir)
                )
            }),
            None => o.owner.rsplit_once(", group ").map(|(_, group)| {
                format!(
                    "If that is pipeline group {group} and this checkpoint is to run it, stop its members and run `host group disband --sink-db {db} --group {} --checkpoint {}` first. ",
                    shell_word(group),
                    shell_word(&cfg.checkpoint.display().to_string())
                )
            }),
        })
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    Err(EngineError::SharedSink {
        moving: moving.concat(),
        url: url.unwrap_or_default(),
        others: described.join("; "),
        delete: ids
            .iter()
            .map(|q| driver.delete_rows_sql(q))
            .collect::<Vec<_>>()
            .join("; "),
    })
}
