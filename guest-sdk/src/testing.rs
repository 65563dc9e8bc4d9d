//! Run stages natively, without wasm, in ordinary `#[test]`s.
//!
//! The helpers go through the same code path as the component (packed
//! encoding included), so what passes here behaves the same in the host.

use crate::run::{MapOutcome, StageError};

/// Run a built mapper over decoded records natively (no packing of the
/// input): the closest native equivalent of one component call, used as
/// the baseline of the plugin benchmark.
pub use crate::run::map_records;
use crate::wire::{self, OwnedHeaders, Record};
use crate::{Config, Mapper};

/// One decoded output, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedOutput {
    /// Index of the input record.
    pub input_index: u32,
    /// Output key.
    pub key: Option<Vec<u8>>,
    /// Output value.
    pub value: Option<Vec<u8>>,
    /// Output headers (key, value).
    pub headers: OwnedHeaders,
}

/// Outputs and rejections of a native map call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapped {
    /// Outputs in order.
    pub outputs: Vec<OwnedOutput>,
    /// Rejected inputs: (index, message).
    pub rejected: Vec<(u32, String)>,
}

fn owned(outcome: MapOutcome) -> Result<Mapped, StageError> {
    let outputs = wire::decode_outputs(&outcome.outputs)
        .map_err(|e| StageError::Fatal(e.to_string()))?
        .into_iter()
        .map(|o| OwnedOutput {
            input_index: o.input_index,
            key: o.key.map(<[u8]>::to_vec),
            value: o.value.map(<[u8]>::to_vec),
            headers: wire::owned_headers(&o.headers),
        })
        .collect();
    Ok(Mapped {
        outputs,
        rejected: outcome.rejected,
    })
}

/// Build `M` from `config` and map `records` (topic/partition/offset as given).
///
/// # Errors
/// The stage's init error (as the component reports it: `stage init: …`,
/// retryable or fatal) or a batch-level error.
pub fn map<M: Mapper>(config: &Config, records: &[Record<'_>]) -> Result<Mapped, StageError> {
    let mut m = M::new(config).map_err(crate::run::init_error)?;
    // Round-trip through the packed encoding, exactly as in the component.
    let mut enc = wire::Encoder::default();
    for r in records {
        enc.push_record(r);
    }
    let packed = enc.finish();
    let decoded = wire::decode_records(&packed).map_err(|e| StageError::Fatal(e.to_string()))?;
    owned(map_records(&mut m, &decoded)?)
}

/// Map values as records of topic `test`, partition 0, offsets from 0.
///
/// # Errors
/// As [`map`].
pub fn map_values<M: Mapper>(config: &Config, values: &[&[u8]]) -> Result<Mapped, StageError> {
    let records: Vec<Record<'_>> = values
        .iter()
        .enumerate()
        .map(|(i, v)| Record::with_value("test", 0, i as i64, v))
        .collect();
    map::<M>(config, &records)
}
