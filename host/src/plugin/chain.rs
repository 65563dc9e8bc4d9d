//! The map chain: run a batch through map stages in order, keeping every
//! output tied to its source record so idempotency keys stay stable.
//!
//! Stage k's outputs are stage k+1's inputs, with the source record's
//! topic, partition, offset and timestamp. The final outputs of one source
//! record are numbered 0, 1, 2, … in order; output n gets idempotency key
//! `{topic}/{partition}/{offset}` (n = 0) or `…#{n}` (DESIGN.md,
//! "Idempotency key"). A record rejected by any stage produces no output
//! and is reported once, with the stage that rejected it.

use sluice_guest::wire::{self, Header, Record};

use super::{CallContext, Instance, PluginError};

/// One final output of the chain, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainOutput {
    /// Index of the source record in the batch.
    pub source_index: usize,
    /// `{topic}/{partition}/{offset}[#n]`.
    pub idempotency_key: String,
    /// Output key (`None` = null key).
    pub key: Option<Vec<u8>>,
    /// Output value (`None` = tombstone).
    pub value: Option<Vec<u8>>,
    /// Output headers.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

/// A source record some stage rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// Index of the source record in the batch.
    pub source_index: usize,
    /// Position of the rejecting stage in the chain (0-based).
    pub stage: usize,
    /// Digest of the rejecting plugin.
    pub plugin_digest: String,
    /// The stage's message.
    pub message: String,
}

/// Result of one batch through the chain.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChainResult {
    /// Final outputs, in source order.
    pub outputs: Vec<ChainOutput>,
    /// Rejected source records, in source order.
    pub rejected: Vec<Rejection>,
}

/// A record between stages: owned content plus its source index.
struct Pending {
    source: usize,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Vec<(String, Option<Vec<u8>>)>,
}

/// Run `source` through `stages` (instances of map plugins, in order).
/// With no stages the records pass through unchanged.
///
/// # Errors
/// The first [`PluginError`] of any stage call (trap, retryable or fatal
/// stage error, malformed result); nothing is partially returned.
pub fn run_chain(
    stages: &mut [Instance],
    ctx: &CallContext,
    source: &[Record<'_>],
) -> Result<ChainResult, PluginError> {
    let mut pending: Vec<Pending> = source
        .iter()
        .enumerate()
        .map(|(i, r)| Pending {
            source: i,
            key: r.key.map(<[u8]>::to_vec),
            value: r.value.map(<[u8]>::to_vec),
            headers: r
                .headers
                .iter()
                .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
                .collect(),
        })
        .collect();
    let mut rejected = Vec::new();

    for (stage_index, instance) in stages.iter_mut().enumerate() {
        let digest = instance.digest().to_string();
        let path = instance.path().to_path_buf();
        // Inputs of this stage: source coordinates with current content.
        let header_views: Vec<Vec<Header<'_>>> = pending
            .iter()
            .map(|p| {
                p.headers
                    .iter()
                    .map(|(k, v)| Header {
                        key: k,
                        value: v.as_deref(),
                    })
                    .collect()
            })
            .collect();
        let inputs: Vec<Record<'_>> = pending
            .iter()
            .zip(header_views)
            .map(|(p, headers)| {
                let s = &source[p.source];
                Record {
                    topic: s.topic,
                    partition: s.partition,
                    offset: s.offset,
                    timestamp: s.timestamp,
                    timestamp_type: s.timestamp_type,
                    key: p.key.as_deref(),
                    value: p.value.as_deref(),
                    headers,
                }
            })
            .collect();
        let result = instance.map(ctx, &inputs)?;
        let outputs =
            wire::decode_outputs(&result.outputs).map_err(|e| PluginError::BadResult {
                path: path.clone(),
                digest: digest.clone(),
                call: "map",
                site: super::describe_site(&inputs),
                reason: e.to_string(),
            })?;
        for bad in &result.rejected {
            let Some(p) = pending.get(bad.index as usize) else {
                return Err(bad_index(&path, &digest, &inputs, bad.index));
            };
            rejected.push(Rejection {
                source_index: p.source,
                stage: stage_index,
                plugin_digest: digest.clone(),
                message: bad.message.clone(),
            });
        }
        let mut next = Vec::with_capacity(outputs.len());
        for o in outputs {
            let Some(p) = pending.get(o.input_index as usize) else {
                return Err(bad_index(&path, &digest, &inputs, o.input_index));
            };
            next.push(Pending {
                source: p.source,
                key: o.key.map(<[u8]>::to_vec),
                value: o.value.map(<[u8]>::to_vec),
                headers: o
                    .headers
                    .iter()
                    .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
                    .collect(),
            });
        }
        drop(inputs);
        pending = next;
    }

    // Outputs must stay in source order for numbering; stages emit in
    // input order, but a stable sort makes it a guarantee.
    pending.sort_by_key(|p| p.source);
    rejected.sort_by_key(|r| r.source_index);
    let mut outputs = Vec::with_capacity(pending.len());
    let mut last: Option<(usize, u32)> = None;
    for p in pending {
        let n = match last {
            Some((s, n)) if s == p.source => n + 1,
            _ => 0,
        };
        last = Some((p.source, n));
        let s = &source[p.source];
        outputs.push(ChainOutput {
            source_index: p.source,
            idempotency_key: wire::idempotency_key(s.topic, s.partition, s.offset, n),
            key: p.key,
            value: p.value,
            headers: p.headers,
        });
    }
    Ok(ChainResult { outputs, rejected })
}

fn bad_index(
    path: &std::path::Path,
    digest: &str,
    inputs: &[Record<'_>],
    index: u32,
) -> PluginError {
    PluginError::BadResult {
        path: path.to_path_buf(),
        digest: digest.to_string(),
        call: "map",
        site: super::describe_site(inputs),
        reason: format!(
            "refers to input index {index}, but the batch has {} records",
            inputs.len()
        ),
    }
}
