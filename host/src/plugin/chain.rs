//! The map chain: run a batch through map stages in order, keeping every
//! output tied to its source record so idempotency keys stay stable.
//!
//! Stage k's outputs are stage k+1's inputs, with the source record's
//! topic, partition, offset and timestamp. The final outputs of one source
//! record are numbered 0, 1, 2, … in order; output n gets idempotency key
//! `{topic}/{partition}/{offset}` (n = 0) or `…#{n}` (DESIGN.md,
//! "Idempotency key"). A record rejected by any stage — inline in the map
//! result, or by a whole-call `bad-record` error, after which the stage is
//! called again without that input — produces no output at all and is
//! reported once, with the first stage that rejected it.

use sluice_guest::wire::{self, OwnedHeaders, Record};

use super::{CallContext, Instance, PluginError, StageFailure, Trapped};

/// One final output of the chain, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainOutput {
    /// Index of the source record in the batch.
    pub source_index: usize,
    /// The source record's offset (its topic and partition are the
    /// batch's): with `output_index`, all the idempotency key needs.
    pub offset: i64,
    /// Position among its source record's outputs (0-based): the `n` of
    /// the idempotency key (see [`ChainOutput::idempotency_key`]).
    pub output_index: u32,
    /// Output key (`None` = null key).
    pub key: Option<Vec<u8>>,
    /// Output value (`None` = tombstone).
    pub value: Option<Vec<u8>>,
    /// Output headers.
    pub headers: OwnedHeaders,
}

impl ChainOutput {
    /// `{topic}/{partition}/{offset}[#n]` (DESIGN.md, "Idempotency key"),
    /// for this output of a record of `topic/partition`. Made when a sink
    /// needs it, not for every output: most pipelines without a sink
    /// plugin never use it.
    pub fn idempotency_key(&self, topic: &str, partition: i32) -> String {
        wire::idempotency_key(topic, partition, self.offset, self.output_index)
    }
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
    /// The stage's message (for a trap: the trap, naming plugin, digest,
    /// offset and limit hit).
    pub message: String,
    /// The record was rejected because its call trapped (found by
    /// [`isolate_traps`]), not by the stage's own verdict.
    pub trapped: bool,
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
    headers: OwnedHeaders,
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
    // Stage inputs: views of the source records for the first stage (their
    // bytes are not copied), then the previous stage's outputs.
    let mut pending: Option<Vec<Pending>> = None;
    let mut rejected = Vec::new();

    for (stage_index, instance) in stages.iter_mut().enumerate() {
        let digest = instance.digest().to_string();
        let path = instance.path().to_path_buf();
        // Inputs of this stage: source coordinates with current content.
        let inputs: Vec<Record<'_>> = match &pending {
            None => source.to_vec(),
            Some(pending) => pending
                .iter()
                .map(|p| Record {
                    key: p.key.as_deref(),
                    value: p.value.as_deref(),
                    headers: wire::header_views(&p.headers),
                    ..source[p.source]
                })
                .collect(),
        };
        // Source index of input `i` of this stage.
        let source_index = |i: usize| match &pending {
            None => i,
            Some(pending) => pending[i].source,
        };
        // Call the stage. A whole-call `bad-record` error rejects that
        // input; the stage is called again with the rest (at most once per
        // input).
        let mut live: Vec<usize> = (0..inputs.len()).collect();
        let mut next = Vec::new();
        while !live.is_empty() {
            let call: Vec<Record<'_>> = live.iter().map(|&i| inputs[i].clone()).collect();
            let result = match instance.map(ctx, &call) {
                Ok(r) => r,
                Err(PluginError::Stage {
                    failure: StageFailure::BadRecord { index, message },
                    ..
                }) if (index as usize) < live.len() => {
                    let input = live.remove(index as usize);
                    rejected.push(Rejection {
                        source_index: source_index(input),
                        stage: stage_index,
                        plugin_digest: digest.clone(),
                        message,
                        trapped: false,
                    });
                    continue;
                }
                Err(e) => return Err(e),
            };
            let bad = |e: wire::WireError| PluginError::BadResult {
                path: path.clone(),
                digest: digest.clone(),
                call: "map",
                site: super::describe_site(&call),
                reason: e.to_string(),
            };
            let n = wire::count_outputs(&result.outputs).map_err(bad)?;
            if n > super::MAX_OUTPUTS_PER_CALL {
                return Err(PluginError::TooManyOutputs {
                    path: path.clone(),
                    digest: digest.clone(),
                    site: super::describe_site(&call),
                    outputs: n,
                    limit: super::MAX_OUTPUTS_PER_CALL,
                });
            }
            let outputs =
                wire::decode_outputs(&result.outputs).map_err(|e| PluginError::BadResult {
                    path: path.clone(),
                    digest: digest.clone(),
                    call: "map",
                    site: super::describe_site(&call),
                    reason: e.to_string(),
                })?;
            // Indices in the result refer to `call`; `live` maps them back.
            let source_of = |i: u32| -> Result<usize, PluginError> {
                live.get(i as usize)
                    .map(|&input| source_index(input))
                    .ok_or_else(|| bad_index(&path, &digest, &call, i))
            };
            for bad in &result.rejected {
                rejected.push(Rejection {
                    source_index: source_of(bad.index)?,
                    stage: stage_index,
                    plugin_digest: digest.clone(),
                    message: bad.message.clone(),
                    trapped: false,
                });
            }
            for o in outputs {
                next.push(Pending {
                    source: source_of(o.input_index)?,
                    key: o.key.map(<[u8]>::to_vec),
                    value: o.value.map(<[u8]>::to_vec),
                    headers: wire::owned_headers(&o.headers),
                });
            }
            break;
        }
        drop(inputs);
        pending = Some(next);
    }
    let mut pending = pending.unwrap_or_else(|| {
        source
            .iter()
            .enumerate()
            .map(|(i, r)| Pending {
                source: i,
                key: r.key.map(<[u8]>::to_vec),
                value: r.value.map(<[u8]>::to_vec),
                headers: wire::owned_headers(&r.headers),
            })
            .collect()
    });

    // A source record is rejected once (its first rejection wins) and, if
    // rejected, none of its outputs survive.
    rejected.sort_by_key(|r| (r.source_index, r.stage));
    rejected.dedup_by_key(|r| r.source_index);
    pending.retain(|p| {
        rejected
            .binary_search_by_key(&p.source, |r| r.source_index)
            .is_err()
    });
    // Outputs must stay in source order for numbering; stages emit in
    // input order, but a stable sort makes it a guarantee.
    pending.sort_by_key(|p| p.source);
    let mut outputs = Vec::with_capacity(pending.len());
    let mut last: Option<(usize, u32)> = None;
    for p in pending {
        let n = match last {
            Some((s, n)) if s == p.source => n + 1,
            _ => 0,
        };
        last = Some((p.source, n));
        outputs.push(ChainOutput {
            source_index: p.source,
            offset: source[p.source].offset,
            output_index: n,
            key: p.key,
            value: p.value,
            headers: p.headers,
        });
    }
    Ok(ChainResult { outputs, rejected })
}

/// Bounds on [`isolate_traps`]: a plugin that traps on many records is
/// broken rather than fed bad data, and a stop request must not wait for a
/// long isolation.
pub struct TrapBudget<'a> {
    /// Set when the process should stop: no further splitting (the rest
    /// runs unsplit, so another trap fails the batch, uncommitted).
    pub stop: &'a std::sync::atomic::AtomicBool,
    /// Trapping calls still allowed while isolating; at zero isolation gives
    /// up with the last trap.
    pub traps_left: u32,
    /// Attempts per call (`--attempts`): a record alone in its call is
    /// rejected only after trapping this many times, and a retryable stage
    /// error is retried as often.
    pub attempts: u32,
}

/// Trapping calls [`isolate_traps`] allows per partition range of a batch
/// by default (the engine shares one budget across the range's map calls
/// of at most 2,000 records): enough to isolate a few bad records (about
/// 11 trapping calls each), few enough that a plugin trapping on
/// everything stops after a bounded number of deadlines.
pub const DEFAULT_ISOLATION_TRAPS: u32 = 48;

/// Find the records whose map call traps, for error policies that keep the
/// pipeline going (`dlq`, `skip`): `source` is a call that trapped with
/// `trap`. The records are run again in halves, recursively, until each
/// trapping record is alone in its call; such a record becomes a
/// [`Rejection`] whose message is the trap (plugin, digest, offset, limit
/// hit), and every other record gets the outputs and idempotency keys it
/// would have had in one call (keys depend only on source coordinates).
///
/// Cost: each trapping record costs about log2(records) trapping calls (for
/// a timeout, each waits for the deadline); `budget` bounds the total.
///
/// # Errors
/// The trap itself when the budget runs out or a stop is requested (the
/// batch then fails as under `--on-error fail`); any non-trap
/// [`PluginError`] of a re-run.
pub fn isolate_traps(
    stages: &mut [Instance],
    ctx: &CallContext,
    source: &[Record<'_>],
    trap: Box<Trapped>,
    budget: &mut TrapBudget<'_>,
) -> Result<ChainResult, PluginError> {
    match source.len() {
        0 => Err(PluginError::Trap(trap)),
        1 => {
            let stage = stages
                .iter()
                .position(|s| s.digest() == trap.digest)
                .unwrap_or(0);
            Ok(ChainResult {
                outputs: Vec::new(),
                rejected: vec![Rejection {
                    source_index: 0,
                    stage,
                    plugin_digest: trap.digest.clone(),
                    message: trap.to_string(),
                    trapped: true,
                }],
            })
        }
        n => {
            tracing::warn!(
                plugin = %trap.digest,
                "a call on {} trapped; running its {n} records again in halves to find the ones that trap",
                trap.site
            );
            let mid = n / 2;
            let mut result = run_part(stages, ctx, &source[..mid], budget)?;
            let second = run_part(stages, ctx, &source[mid..], budget)?;
            result
                .outputs
                .extend(second.outputs.into_iter().map(|mut o| {
                    o.source_index += mid;
                    o
                }));
            result
                .rejected
                .extend(second.rejected.into_iter().map(|mut r| {
                    r.source_index += mid;
                    r
                }));
            Ok(result)
        }
    }
}

/// Find the first record whose map call traps on its own, for
/// `--on-error fail`: `source` is a call that trapped with `trap` after its
/// attempts. The first half is run again; if it traps the search goes on
/// inside it, else inside the second half, until one record is left. So the
/// error names an offset rather than a range of up to 2,000 records, at the
/// cost of about log2(records) more calls (for a timeout, up to one
/// deadline each; at most 11 for 2,000 records).
///
/// Returns the lone record's own trap; `trap` itself when the records do
/// not trap in smaller calls (the fault depends on what ran before it in
/// the instance), when the search meets an error that is not a trap, or
/// when `stop` is set (a stop request does not wait for the search).
pub fn narrow_trap(
    stages: &mut [Instance],
    ctx: &CallContext,
    source: &[Record<'_>],
    trap: Box<Trapped>,
    stop: &std::sync::atomic::AtomicBool,
) -> Box<Trapped> {
    let mut part = source;
    let mut found = trap.clone();
    while part.len() > 1 {
        if stop.load(std::sync::atomic::Ordering::Relaxed) {
            return trap;
        }
        let (first, second) = part.split_at(part.len() / 2);
        match run_chain(stages, ctx, first) {
            Err(PluginError::Trap(t)) => {
                found = t;
                part = first;
            }
            Ok(_) => match run_chain(stages, ctx, second) {
                Err(PluginError::Trap(t)) => {
                    found = t;
                    part = second;
                }
                _ => return trap,
            },
            Err(_) => return trap,
        }
    }
    if part.len() == 1 && part.len() < source.len() {
        tracing::info!(
            plugin = %found.digest,
            "the call on {} trapped; run again in halves, the first record that traps alone is at {}",
            trap.site,
            found.site
        );
    }
    found
}

fn run_part(
    stages: &mut [Instance],
    ctx: &CallContext,
    part: &[Record<'_>],
    budget: &mut TrapBudget<'_>,
) -> Result<ChainResult, PluginError> {
    let mut attempt = 1;
    loop {
        if budget.stop.load(std::sync::atomic::Ordering::Relaxed) {
            // No more splitting: a trap now ends the batch.
            return run_chain(stages, ctx, part);
        }
        match run_chain(stages, ctx, part) {
            Err(PluginError::Trap(t)) if budget.traps_left == 0 => {
                tracing::error!(
                    "giving up finding the records that trap: the plugin trapped on more calls than the isolation allows ({DEFAULT_ISOLATION_TRAPS} per partition and batch); it looks broken rather than fed bad records"
                );
                return Err(PluginError::Trap(t));
            }
            Err(PluginError::Trap(t)) => {
                budget.traps_left -= 1;
                if part.len() == 1 && attempt < budget.attempts {
                    // A lone record gets the same attempts as a whole call
                    // (a deadline can be missed on a busy machine).
                    attempt += 1;
                    continue;
                }
                return isolate_traps(stages, ctx, part, t, budget);
            }
            Err(e) if e.is_retryable() && attempt < budget.attempts => {
                tracing::warn!("{e}; retrying (attempt {attempt} of {})", budget.attempts);
                attempt += 1;
            }
            other => return other,
        }
    }
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
