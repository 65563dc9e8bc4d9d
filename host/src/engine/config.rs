//! The pipeline definition `host run` executes: one struct, filled from the
//! TOML config file and the command-line flags (flags win).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::plugin::Limits;

/// What to do with a record a map stage rejects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ErrorPolicy {
    /// Stop before committing the batch; exit non-zero; nothing is lost.
    Fail,
    /// Store the record in `sluice_dead_letters` (needs `--sink-db`), in
    /// the same transaction as the writes of its part of the range.
    Dlq,
    /// Count it, log it, go on.
    Skip,
}

/// What to do when planned offsets were deleted by retention.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DataLossPolicy {
    /// Stop with an error naming topic, partition and missing range.
    Fail,
    /// Resume at the log start and record the gap in the commit entry.
    Skip,
}

/// Where partitions without a checkpointed position start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StartingOffsets {
    /// The log start offset.
    Earliest,
    /// The high watermark (only records produced from now on).
    Latest,
}

/// How progress is reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProgressMode {
    /// A live status line on stderr when stdout is a terminal, else JSON.
    Auto,
    /// One JSON line per committed batch on stdout (for machines).
    Json,
    /// A live status line on stderr (batch, records/s, lag), redrawn under
    /// the log lines.
    Line,
    /// Nothing beyond the log.
    None,
}

/// Everything `host run` needs.
#[derive(Debug, Clone)]
pub struct PipelineConfig {
    /// Kafka bootstrap servers.
    pub brokers: String,
    /// Subscribed topics.
    pub topics: Vec<String>,
    /// Checkpoint directory.
    pub checkpoint: PathBuf,
    /// Plugin components in stage order; empty = resume with the plugins
    /// recorded in the checkpoint.
    pub plugins: Vec<PathBuf>,
    /// `--config k=v` pairs for plugins.
    pub plugin_config: BTreeMap<String, String>,
    /// librdkafka properties (`--config kafka.<name>=v`, `[kafka]` table).
    pub kafka: BTreeMap<String, String>,
    /// `sqlite:PATH` or `postgres://…`.
    pub sink_db: Option<String>,
    /// A file whose first line is the PostgreSQL password, for a
    /// `sink_db` URL without one (else `PGPASSWORD`, `~/.pgpass`).
    pub sink_db_password_file: Option<PathBuf>,
    /// How long to keep reconnecting to a lost sink database before the
    /// job stops.
    pub sink_retry_for: Duration,
    /// Connections to the sink database that apply parts concurrently
    /// (`--sink-connections`, at least 1; more than 1 on PostgreSQL only):
    /// each has its own sink plugin instance, and the parts of one
    /// partition all go to one connection, in order.
    pub sink_connections: usize,
    /// The pipeline group this host is a member of (`--group`): the Kafka
    /// consumer group and the key of the group's checkpoint in the sink
    /// database. `None`: a pipeline of its own with a checkpoint directory.
    pub group: Option<String>,
    /// PostgreSQL schema of the host's tables (`None`: `public`).
    pub sink_schema: Option<String>,
    /// PostgreSQL role plugin statements run as (`None`: the login role).
    pub sink_plugin_role: Option<String>,
    /// Records per partition per batch.
    pub max_records_per_partition: u64,
    /// Time between batch starts when there is little data.
    pub trigger_interval: Duration,
    /// Stop once the data available at start is processed.
    pub until_caught_up: bool,
    /// Bad-record policy.
    pub on_error: ErrorPolicy,
    /// Deleted-range policy.
    pub on_data_loss: DataLossPolicy,
    /// Where new checkpoints start.
    pub starting_offsets: StartingOffsets,
    /// Consumer group that processed offsets are also committed to, for
    /// lag dashboards only (`--commit-offsets-to`).
    pub commit_offsets_to: Option<String>,
    /// Plugin sandbox limits.
    pub limits: Limits,
    /// Batches of checkpoint entries kept.
    pub retention: u64,
    /// Adopt different topics than the checkpoint's.
    pub allow_fingerprint_change: bool,
    /// Start although the sink database holds another pipeline's progress
    /// on the same topics (`--allow-shared-sink`).
    pub allow_shared_sink: bool,
    /// `--upgrade`: a group member's `plugins` replace the group's current
    /// ones (without it, differing plugins are refused).
    pub upgrade: bool,
    /// Wait this long for the checkpoint lock.
    pub wait: Option<Duration>,
    /// Bound on each broker operation (metadata, watermarks, fetch).
    pub kafka_timeout: Duration,
    /// Attempts for a retryable stage failure or trap (1 = no retry).
    pub attempts: u32,
    /// Map threads (`--map-threads`, at least 1): each runs its own
    /// instances of the map chain, and the ranges of a batch are spread
    /// over them ([`default_map_threads`]).
    pub map_threads: usize,
    /// How each committed batch is reported.
    pub progress: ProgressMode,
    /// Serve Prometheus metrics on this address.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Where a map-only pipeline's outputs go (`--output-topic`): `None`,
    /// they are counted and discarded.
    pub output: Option<crate::output::OutputConfig>,
}

/// The default of `--map-threads`: the cores this process may use
/// ([`std::thread::available_parallelism`], which honours CPU affinity and
/// cgroup quotas) less the two that the fetch and the sink threads keep
/// busy, at least 1 and at most [`DEFAULT_MAP_THREADS_MAX`]. A 2-core
/// machine thus maps on one thread, as before the option existed.
pub fn default_map_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(1, std::num::NonZeroUsize::get)
        .saturating_sub(2)
        .clamp(1, DEFAULT_MAP_THREADS_MAX)
}

/// The most map threads the default gives: every thread holds its own
/// instance of each map stage (memory up to `--plugin-memory` each, its
/// own log allowance), so a big machine does not get dozens of instances
/// unasked; `--map-threads` goes higher.
pub const DEFAULT_MAP_THREADS_MAX: usize = 4;

/// `s` as one POSIX shell word (single-quoted unless it is plain), for
/// commands that messages print for the user to run.
pub fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:,=@+%".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// A librdkafka property's value as messages show it: `***` for the
/// value of a property whose name says it is a secret (`sasl.password`,
/// `ssl.key.password`, `sasl.oauthbearer.client.secret`, …).
pub fn redact_property(name: &str, value: &str) -> String {
    if crate::source::is_secret_property(name) {
        "***".into()
    } else {
        value.to_string()
    }
}

impl PipelineConfig {
    /// The `host checkpoint reset` command that moves `topic` of this
    /// pipeline, and its sink's progress rows, to the earliest offsets:
    /// what error messages advise after a recreated or truncated topic.
    /// Secrets (a password in `--sink-db`, secret librdkafka properties)
    /// show as `***`.
    pub fn reset_command(&self, topic: &str) -> String {
        // Absolute paths: the command must work from any directory.
        let dir = std::path::absolute(&self.checkpoint).unwrap_or_else(|_| self.checkpoint.clone());
        let mut cmd = match &self.group {
            // A group's position is its progress rows: only --reapply
            // moves them back to a log that starts again.
            Some(group) => format!(
                "host group reset --group {} --topic {} --to earliest --reapply --brokers {}",
                shell_word(group),
                shell_word(topic),
                shell_word(&self.brokers)
            ),
            None => format!(
                "host checkpoint reset {} --topic {} --to earliest --brokers {}",
                shell_word(&dir.display().to_string()),
                shell_word(topic),
                shell_word(&self.brokers)
            ),
        };
        for (k, v) in &self.kafka {
            cmd.push_str(" --config ");
            cmd.push_str(&shell_word(&format!("kafka.{k}={}", redact_property(k, v))));
        }
        if let Some(db) = &self.sink_db {
            cmd.push_str(" --sink-db ");
            let db = crate::capability::sql::sink_identity(db)
                .unwrap_or_else(|_| crate::capability::sql::redact(db));
            cmd.push_str(&shell_word(&db));
        }
        if let Some(schema) = &self.sink_schema {
            cmd.push_str(" --sink-schema ");
            cmd.push_str(&shell_word(schema));
        }
        cmd
    }

    /// A configuration with the documented defaults.
    pub fn new(
        brokers: impl Into<String>,
        topics: Vec<String>,
        checkpoint: impl Into<PathBuf>,
    ) -> Self {
        PipelineConfig {
            brokers: brokers.into(),
            topics,
            checkpoint: checkpoint.into(),
            plugins: Vec::new(),
            plugin_config: BTreeMap::new(),
            kafka: BTreeMap::new(),
            sink_db: None,
            sink_db_password_file: None,
            sink_retry_for: crate::sink::DEFAULT_RECONNECT_FOR,
            sink_connections: 1,
            group: None,
            sink_schema: None,
            sink_plugin_role: None,
            max_records_per_partition: 10_000,
            trigger_interval: Duration::from_secs(1),
            until_caught_up: false,
            on_error: ErrorPolicy::Fail,
            on_data_loss: DataLossPolicy::Fail,
            starting_offsets: StartingOffsets::Earliest,
            commit_offsets_to: None,
            limits: Limits::default(),
            retention: crate::checkpoint::DEFAULT_RETENTION,
            allow_fingerprint_change: false,
            allow_shared_sink: false,
            upgrade: false,
            wait: None,
            kafka_timeout: Duration::from_secs(30),
            attempts: 3,
            map_threads: default_map_threads(),
            progress: ProgressMode::Json,
            metrics_addr: None,
            output: None,
        }
    }
}
