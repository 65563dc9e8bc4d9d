//! The sink stage under `host test`: a rehearsal of what `host run` would
//! apply, one partition at a time, with every SQL statement the sink
//! sends printed, and every record it sends to a Kafka topic (`send`
//! lines, with `--output-topic`).
//!
//! Each partition's mapped records go to the sink as one part: `open`,
//! one `write` per record (so each statement shows at the record whose
//! write sent it; a sink that keeps changes for later, as the cdc sink's
//! `batch_rows` does, shows them at the record that made it flush, or at
//! `close`), then `close`. The part runs inside a transaction of its own,
//! committed (`keep`) or rolled back, or on a session with no database
//! ([`SqlGrant::dry`]: `not_run`); a `part` line after its last record
//! says which. A record the sink rejects is taken out and the part
//! rehearsed again without it on a fresh instance, as `host run
//! --on-error dlq` applies a part again without its dead letters; only
//! the last rehearsal's statements are printed. Each part after the first also starts on a
//! fresh instance, as its `init` may have been rolled back with the part
//! before.

use std::collections::{BTreeMap, HashSet};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Value, json};
use sluice_guest::wire;

use super::input::Owned;
use crate::capability::sql::{Ran, SqlGrant, SqlValue};
use crate::plugin::chain::ChainOutput;
use crate::plugin::{
    CallContext, Instance, OpenAnswer, PartitionContext, PluginError, StageFailure,
};

/// What the sink did, as JSON lines placed among the map's lines.
#[derive(Default)]
pub(super) struct Rehearsal {
    /// Lines to print before the map outputs of a source index (the
    /// statements of `open`, at the part's first record).
    pub before: BTreeMap<usize, Vec<Value>>,
    /// Lines to print after them (the statements of the record's writes,
    /// and those of `close` at the part's last record).
    pub after: BTreeMap<usize, Vec<Value>>,
    /// Source records the sink rejected, with its message.
    pub rejected: Vec<(usize, String)>,
    /// The statements of the write that made the sink reject a record
    /// (printed before its `bad_record` line).
    pub rejected_lines: BTreeMap<usize, Vec<Value>>,
    /// Statements printed.
    pub statements: usize,
    /// Parts whose transaction was committed.
    pub committed: usize,
    /// The error that stopped the sink (a fatal stage error, a trap, a
    /// database that cannot open a transaction); nothing ran after it.
    pub failed: Option<anyhow::Error>,
}

/// One attempt at a part stopped early.
enum Stop {
    /// The sink rejected the record at this source index.
    Rejected(usize, String),
    /// Anything else: the rehearsal ends.
    Failed(anyhow::Error),
}

/// A parameter as JSON: text and numbers as themselves, bytes as
/// `{"b64": …}`.
fn param(v: &SqlValue) -> Value {
    match v {
        SqlValue::Null => Value::Null,
        SqlValue::Integer(n) => json!(n),
        SqlValue::Real(r) => json!(r),
        SqlValue::Text(t) => json!(t),
        SqlValue::Blob(b) => json!({ "b64": B64.encode(b) }),
    }
}

/// The line of one statement.
fn line(r: &PartitionContext, offset: Option<i64>, call: &str, ran: Ran) -> Value {
    let mut obj = json!({
        "type": "sql",
        "topic": r.topic,
        "partition": r.partition,
        "offset": offset,
        "call": call,
        "statement": ran.sql,
        "params": ran.params.iter().map(param).collect::<Vec<_>>(),
    });
    match ran.outcome {
        Ok(Some(n)) => {
            obj[if ran.query {
                "rows_returned"
            } else {
                "rows_changed"
            }] = json!(n)
        }
        Ok(None) => {}
        Err(e) => obj["error"] = json!(e.to_string()),
    }
    obj
}

/// Where a rehearsal's effects go.
pub(super) struct Targets {
    /// Commit each part's transaction (else roll it back).
    pub keep: bool,
    /// Partitions of each output topic the sink may send to (`None`: no
    /// `--output-topic`), to show the partition of a keyed record.
    pub partitions: Option<i32>,
}

/// Rehearse the sink over the map's `outputs` of `owned`, partition by
/// partition in the order they first appear.
pub(super) fn rehearse(
    sink: &mut Instance,
    grant: &SqlGrant,
    ctx: &CallContext,
    (owned, outputs): (&[Owned], &[ChainOutput]),
    to: Targets,
) -> Rehearsal {
    let keep = to.keep;
    let mut out = Rehearsal::default();
    let mut parts: Vec<(&str, i32)> = Vec::new();
    for o in owned {
        if !parts.contains(&(o.topic.as_str(), o.partition)) {
            parts.push((&o.topic, o.partition));
        }
    }
    for (n, (topic, partition)) in parts.into_iter().enumerate() {
        if n > 0 {
            sink.discard();
        }
        let in_part = |i: usize| owned[i].topic == topic && owned[i].partition == partition;
        let indexes: Vec<usize> = (0..owned.len()).filter(|&i| in_part(i)).collect();
        let offsets = indexes.iter().map(|&i| owned[i].record.offset);
        let (Some(start), Some(end), Some(&first), Some(&last)) = (
            offsets.clone().min(),
            offsets.max(),
            indexes.first(),
            indexes.last(),
        ) else {
            continue;
        };
        let range = PartitionContext {
            batch: ctx.clone(),
            topic: topic.to_string(),
            partition,
            start_offset: start,
            end_offset: end + 1,
        };
        let part: Vec<&ChainOutput> = outputs.iter().filter(|o| in_part(o.source_index)).collect();
        let mut excluded: HashSet<usize> = HashSet::new();
        loop {
            let mut lines: Vec<(Place, Value)> = Vec::new();
            let r = attempt(
                sink,
                grant,
                &range,
                owned,
                &part,
                &excluded,
                &to,
                |at, v| {
                    lines.push((at, v));
                },
            );
            if let Err(Stop::Rejected(i, m)) = &r
                && excluded.insert(*i)
            {
                // Only the last rehearsal of a part is printed, and the
                // statements that made the sink reject this record. The
                // next one starts on a fresh instance, as under `host run`
                // (its `init` was rolled back with the part).
                out.rejected.push((*i, m.clone()));
                for (at, v) in lines {
                    if matches!(at, Place::Write(w) if w == *i) {
                        out.statements += usize::from(v["type"] == "sql");
                        out.rejected_lines.entry(*i).or_default().push(v);
                    }
                }
                sink.discard();
                continue;
            }
            for (at, v) in lines {
                out.statements += usize::from(v["type"] == "sql");
                let (map, i) = match at {
                    Place::Open => (&mut out.before, first),
                    Place::Write(i) => (&mut out.after, i),
                    Place::Close => (&mut out.after, last),
                };
                map.entry(i).or_default().push(v);
            }
            let outcome = match (&r, keep) {
                // No database: nothing ran, nothing to roll back.
                (Ok(()), _) if grant.is_dry() => "not_run",
                (Ok(()), true) => "committed",
                (Ok(()), false) => "rolled_back",
                (Err(_), _) => "failed",
            };
            out.after.entry(last).or_default().push(json!({
                "type": "part",
                "topic": range.topic,
                "partition": range.partition,
                "start_offset": range.start_offset,
                "end_offset": range.end_offset,
                "outcome": outcome,
            }));
            if outcome == "committed" {
                out.committed += 1;
            }
            match r {
                Ok(()) => break,
                Err(Stop::Rejected(_, m)) => {
                    out.failed = Some(anyhow::anyhow!(
                        "the sink rejected a record it was not given: {m}"
                    ));
                    return out;
                }
                Err(Stop::Failed(e)) => {
                    out.failed = Some(e);
                    return out;
                }
            }
        }
    }
    out
}

/// Which call of a part sent a statement.
#[derive(Clone, Copy)]
enum Place {
    /// `open`.
    Open,
    /// The `write` of the record at this source index.
    Write(usize),
    /// `close`.
    Close,
}

/// The `send` lines of what the sink sent since the last look, from the
/// source record at `offset` (`None`: `open` or `close`).
fn sent_lines(
    sink: &mut Instance,
    r: &PartitionContext,
    offset: Option<i64>,
    partitions: Option<i32>,
) -> Result<Vec<Value>, Stop> {
    let sent = sink
        .take_sent()
        .map_err(|e| Stop::Failed(anyhow::anyhow!("kafka.send refused: {e}")))?;
    Ok(sent
        .into_iter()
        .map(|s| {
            let mut obj = serde_json::Map::new();
            obj.insert("type".into(), "send".into());
            obj.insert("idempotency_key".into(), s.idempotency_key.into());
            obj.insert("topic".into(), r.topic.clone().into());
            obj.insert("partition".into(), r.partition.into());
            obj.insert("offset".into(), offset.into());
            super::put_bytes(&mut obj, "key", s.key.as_deref());
            super::put_bytes(&mut obj, "value", s.value.as_deref());
            let headers: Vec<Value> = s
                .headers
                .iter()
                .map(|(k, v)| {
                    let mut h = serde_json::Map::new();
                    h.insert("key".into(), k.clone().into());
                    super::put_bytes(&mut h, "value", v.as_deref());
                    Value::Object(h)
                })
                .collect();
            obj.insert("headers".into(), headers.into());
            let partition = s.partition.or_else(|| {
                partitions.and_then(|n| crate::output::partition_of_key(s.key.as_deref(), n))
            });
            obj.insert(
                "produced_to".into(),
                json!({ "topic": s.topic, "partition": partition }),
            );
            Value::Object(obj)
        })
        .collect())
}

/// One rehearsal of a part: `open`, a `write` per record not in
/// `excluded`, `close`, in a transaction committed at the end when
/// `to.keep` and all went well, else rolled back; `emit` gets each
/// statement's line and each sent record's.
#[allow(clippy::too_many_arguments)]
fn attempt(
    sink: &mut Instance,
    grant: &SqlGrant,
    range: &PartitionContext,
    owned: &[Owned],
    part: &[&ChainOutput],
    excluded: &HashSet<usize>,
    to: &Targets,
    mut emit: impl FnMut(Place, Value),
) -> Result<(), Stop> {
    let keep = to.keep;
    grant
        .begin_rehearsal()
        .map_err(|e| Stop::Failed(anyhow::anyhow!("sink database: {e}")))?;
    let _ = grant.take_ran();
    let r = (|| {
        let answer = sink.sink_open(range);
        for ran in grant.take_ran() {
            emit(Place::Open, line(range, None, "open", ran));
        }
        let sent = sent_lines(sink, range, None, to.partitions);
        if answer.map_err(|e| Stop::Failed(e.into()))? == OpenAnswer::AlreadyApplied {
            // `host run` drops what such a part sent.
            tracing::info!(
                "the sink answered already-applied to {}/{} [{}, {}): nothing written",
                range.topic,
                range.partition,
                range.start_offset,
                range.end_offset
            );
            return Ok(());
        }
        for l in sent? {
            emit(Place::Open, l);
        }
        for o in part.iter().filter(|o| !excluded.contains(&o.source_index)) {
            let s = &owned[o.source_index];
            let rec = s.record.view_with(
                &s.topic,
                s.partition,
                o.key.as_deref(),
                o.value.as_deref(),
                &o.headers,
            );
            let mut enc = wire::Encoder::with_capacity(256);
            enc.push_sink_record(&o.idempotency_key(&s.topic, s.partition), &rec);
            let site = || format!("{}/{} offset {}", s.topic, s.partition, s.record.offset);
            let w = sink.sink_write(enc.finish(), site);
            for ran in grant.take_ran() {
                let l = line(range, Some(s.record.offset), "write", ran);
                emit(Place::Write(o.source_index), l);
            }
            let sent = sent_lines(sink, range, Some(s.record.offset), to.partitions);
            match w {
                Ok(()) => {}
                Err(PluginError::Stage {
                    failure: StageFailure::BadRecord { message, .. },
                    ..
                }) => return Err(Stop::Rejected(o.source_index, message)),
                Err(e) => return Err(Stop::Failed(e.into())),
            }
            for l in sent? {
                emit(Place::Write(o.source_index), l);
            }
        }
        let c = sink.sink_close(|| {
            format!(
                "{}/{} offsets [{}, {})",
                range.topic, range.partition, range.start_offset, range.end_offset
            )
        });
        for ran in grant.take_ran() {
            emit(Place::Close, line(range, None, "close", ran));
        }
        c.map_err(|e| Stop::Failed(e.into()))?;
        for l in sent_lines(sink, range, None, to.partitions)? {
            emit(Place::Close, l);
        }
        Ok(())
    })();
    let failed = grant.end_rehearsal(keep && r.is_ok());
    match (r, failed) {
        // The record's own error wins: the part runs again without it.
        (Err(Stop::Rejected(i, m)), _) => Err(Stop::Rejected(i, m)),
        (Err(e), _) => Err(e),
        (Ok(()), Some(e)) => Err(Stop::Failed(anyhow::anyhow!(
            "host run would roll this part back: {e}"
        ))),
        (Ok(()), None) => Ok(()),
    }
}
