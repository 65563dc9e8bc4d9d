//! The sink's errors: each names where (topic, partition, offsets) and
//! what to do.

use crate::capability::sql::DbError;
use crate::plugin::PluginError;

/// Errors of the sink driver.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// The plugin trapped or returned an error; the range (part) was
    /// rolled back, earlier parts stay applied.
    #[error("{0}; this range was rolled back (earlier parts of the batch stay applied)")]
    Plugin(#[from] PluginError),
    /// The sink plugin rejected one record: a `bad-record` error from
    /// `sink.write`. With the SQL capability the range (part) was rolled
    /// back; the engine applies the error policy to the record and writes
    /// the part again without it.
    #[error("{error} (the record at offset {offset})")]
    Rejected {
        /// Source offset of the rejected record.
        offset: i64,
        /// The sink's message.
        message: String,
        /// The plugin's error, naming plugin, digest and call.
        error: Box<PluginError>,
    },
    /// A database error; the range (part) was rolled back, earlier parts
    /// stay applied.
    #[error(
        "sink database error during {during} on {site}: {error}; this range was rolled back (earlier parts of the batch stay applied)"
    )]
    Sql {
        /// What the host or plugin was doing.
        during: &'static str,
        /// `topic/partition [start, end)`.
        site: String,
        /// The database's error (message and code).
        error: DbError,
    },
    /// A newer epoch already wrote this partition: we are a zombie.
    #[error(
        "sink fenced on {site}: sluice_progress holds epoch {stored} but this process runs epoch {ours}; another process owns the pipeline now"
    )]
    Fenced {
        /// `topic/partition [start, end)`.
        site: String,
        /// Epoch in the progress row.
        stored: u64,
        /// Ours.
        ours: u64,
    },
    /// A pipeline group's member lost the partition: another member
    /// claimed it (a newer owner epoch) since this one did.
    #[error("{0}; the part was rolled back and this member drops the partition")]
    Group(crate::checkpoint::group::GroupError),
    /// The progress row changed between this range's read and its update:
    /// another process wrote the same query id's progress.
    #[error(
        "sluice_progress for {site} changed while this range was applied (now: {now}); is another process writing this query id's progress? This range was rolled back"
    )]
    ProgressChanged {
        /// `topic/partition [start, end)`.
        site: String,
        /// What the row holds now.
        now: String,
    },
    /// The sink's `kafka.send` was refused, or what it sent could not be
    /// produced; the part is not recorded as applied.
    #[error(
        "{what} on {site}: {message}; the part is not recorded as applied, and the batch's re-run writes it again"
    )]
    Send {
        /// Whose records, and what went wrong.
        what: String,
        /// `topic/partition [start, end)`.
        site: String,
        /// The refusal or the producer's error.
        message: String,
    },
    /// Dead letters without a database to put them in.
    #[error("the dlq error policy needs a sink database (--sink-db) to store dead letters")]
    NoDeadLetterStore,
}

impl SinkError {
    /// The sink database's connection is gone ([`DbError::is_connection_lost`]).
    pub fn is_connection_lost(&self) -> bool {
        matches!(self, SinkError::Sql { error, .. } if error.is_connection_lost())
    }

    /// The part met another session's locks, a deadlock or a
    /// serialization failure ([`DbError::is_contention`]).
    pub fn is_contention(&self) -> bool {
        matches!(self, SinkError::Sql { error, .. } if error.is_contention())
    }

    /// Worth another attempt at the same part: a retryable plugin failure
    /// or trap, or a transient database error ([`DbError::is_transient`]);
    /// the part was rolled back either way.
    pub fn is_retryable(&self) -> bool {
        match self {
            SinkError::Plugin(p) => p.is_retryable(),
            // Contention and a lost connection were retried by
            // [`SinkDriver::apply`] for its whole budget already.
            SinkError::Sql { error, .. } => {
                error.is_transient() && !error.is_contention() && !error.is_connection_lost()
            }
            _ => false,
        }
    }
}
