//! Drives a [`Mapper`] or [`Sink`] over packed batches: decode, call per
//! record, collect outputs and rejections, map errors to `stage-error`.

use std::sync::Mutex;

use crate::host::host;
use crate::wire::{self, Encoder, Record};
use crate::{Config, Emit, Error, Mapper, OpenAnswer, PartitionContext, Sink};

/// Why a whole stage call failed (the WIT `stage-error`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StageError {
    /// Record `index` of the call is bad.
    BadRecord {
        /// Index in the call's batch.
        index: u32,
        /// Why.
        message: String,
    },
    /// Retry the call.
    Retryable(String),
    /// Stop the batch.
    Fatal(String),
}

/// The result of mapping one batch.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MapOutcome {
    /// `packed-outputs`.
    pub outputs: Vec<u8>,
    /// Rejected inputs: (index in the batch, message).
    pub rejected: Vec<(u32, String)>,
}

/// Holds a stage's per-instance value, created on first use from the
/// host's config (and, for a sink, initialised before its first `open`).
pub struct Slot<T>(Mutex<Option<T>>);

impl<T> Default for Slot<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Slot<T> {
    /// An empty slot (usable in a `static`).
    pub const fn new() -> Self {
        Slot(Mutex::new(None))
    }

    fn with<R>(
        &self,
        init: impl FnOnce(&Config) -> Result<T, Error>,
        f: impl FnOnce(&mut T) -> Result<R, StageError>,
    ) -> Result<R, StageError> {
        let mut guard = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            let config = Config::from_pairs(host().config_all());
            let value = init(&config).map_err(init_error)?;
            *guard = Some(value);
        }
        match guard.as_mut() {
            Some(v) => f(v),
            None => Err(StageError::Fatal("stage not initialised".into())),
        }
    }
}

/// A failing `new` or `init` stops the call; only a retryable one is
/// tried again.
pub(crate) fn init_error(e: Error) -> StageError {
    match e {
        Error::Retryable(m) => StageError::Retryable(format!("stage init: {m}")),
        Error::BadRecord(m) | Error::Fatal(m) => StageError::Fatal(format!("stage init: {m}")),
    }
}

/// A sink and whether its [`Sink::init`] ran.
pub struct Initialised<S> {
    sink: S,
    ready: bool,
}

impl<S: Sink> Initialised<S> {
    fn new(config: &Config) -> Result<Self, Error> {
        S::new(config).map(|sink| Initialised { sink, ready: false })
    }
}

fn stage_error(index: u32, e: Error) -> StageError {
    match e {
        Error::BadRecord(message) => StageError::BadRecord { index, message },
        Error::Retryable(m) => StageError::Retryable(m),
        Error::Fatal(m) => StageError::Fatal(m),
    }
}

/// Map decoded records with `m`.
///
/// # Errors
/// A [`Error::Retryable`] or [`Error::Fatal`] from `m` ends the call;
/// bad records are collected in [`MapOutcome::rejected`].
pub fn map_records<M: Mapper>(m: &mut M, records: &[Record<'_>]) -> Result<MapOutcome, StageError> {
    let bytes: usize = records
        .iter()
        .map(|r| r.value.map_or(0, <[u8]>::len) + 32)
        .sum();
    let mut enc = Encoder::with_capacity(bytes);
    let mut rejected = Vec::new();
    for (i, record) in records.iter().enumerate() {
        let index = i as u32;
        let (len, count) = (enc.len(), enc.count());
        let mut emit = Emit {
            enc: &mut enc,
            index,
            emitted: 0,
        };
        match m.map(record, &mut emit) {
            Ok(()) => {}
            Err(Error::BadRecord(message)) => {
                enc.truncate(len, count);
                rejected.push((index, message));
            }
            Err(e) => return Err(stage_error(index, e)),
        }
    }
    Ok(MapOutcome {
        outputs: enc.finish(),
        rejected,
    })
}

/// Entry point of the generated `mapper.map` export.
///
/// # Errors
/// [`StageError::Fatal`] for an undecodable batch or a failing init.
pub fn map_packed<M: Mapper>(slot: &Slot<M>, packed: &[u8]) -> Result<MapOutcome, StageError> {
    let records = wire::decode_records(packed).map_err(|e| StageError::Fatal(e.to_string()))?;
    slot.with(M::new, |m| map_records(m, &records))
}

/// Entry point of the generated `sink.open` export.
///
/// # Errors
/// The sink's own error, or a failing init.
pub fn sink_open<S: Sink>(
    slot: &Slot<Initialised<S>>,
    ctx: &PartitionContext,
) -> Result<OpenAnswer, StageError> {
    slot.with(Initialised::new, |s| {
        if !s.ready {
            s.sink.init().map_err(init_error)?;
            s.ready = true;
        }
        s.sink.open(ctx).map_err(|e| stage_error(0, e))
    })
}

/// Entry point of the generated `sink.write` export.
///
/// # Errors
/// The first error the sink returns, with the record's index in the chunk.
pub fn sink_write_packed<S: Sink>(
    slot: &Slot<Initialised<S>>,
    packed: &[u8],
) -> Result<(), StageError> {
    let records =
        wire::decode_sink_records(packed).map_err(|e| StageError::Fatal(e.to_string()))?;
    slot.with(Initialised::new, |s| {
        s.sink
            .write_chunk(&records)
            .map_err(|(i, e)| stage_error(i as u32, e))
    })
}

/// Entry point of the generated `sink.close` export.
///
/// # Errors
/// The sink's own error.
pub fn sink_close<S: Sink>(slot: &Slot<Initialised<S>>) -> Result<(), StageError> {
    slot.with(Initialised::new, |s| {
        s.sink.close().map_err(|e| stage_error(0, e))
    })
}
