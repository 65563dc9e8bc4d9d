//! Membership of a Kafka consumer group (DESIGN.md, "Scale beyond one
//! machine: pipeline groups"): the group coordinator assigns partitions,
//! detects dead members and hands out new partitions; Sluice only answers
//! each rebalance.
//!
//! The consumer subscribes with the classic protocol and
//! `partition.assignment.strategy=cooperative-sticky` (or, with
//! `group.protocol=consumer`, KIP-848's protocol, whose assignments are
//! incremental too), and overrides
//! rust-rdkafka's `ConsumerContext::rebalance` itself (not the pre/post
//! hooks) so that an assignment is taken only after its partitions were
//! claimed, and starts at the offsets the claims returned:
//! - **assign**: [`Membership::assigned`] claims the new partitions (in
//!   the sink database, for a pipeline group) and says where each starts;
//!   they are then added with `incremental_assign` at those offsets.
//! - **revoke**: [`Membership::revoked`] is told first (the owner stops
//!   writing those partitions), then they are removed with
//!   `incremental_unassign`. A lost assignment (the session timed out) is
//!   reported as such.
//!
//! The callbacks run inside `poll`, on the thread that fetches.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::error::KafkaResult;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{Offset, TopicPartitionList};

use super::TopicPartition;
use super::client_log::{ClientErrors, client_error, client_log};

/// What a group member does when the coordinator changes its assignment.
pub trait Membership: Send + Sync {
    /// `partitions` were assigned to this member, whose member id the
    /// coordinator made `member_id`: claim them and return where each
    /// starts (the first offset to read; [`START_EARLIEST`] or
    /// [`START_LATEST`] for a partition with no position yet), or why it
    /// cannot be taken (the member should then stop and leave the group).
    fn assigned(
        &self,
        partitions: &[TopicPartition],
        member_id: &str,
    ) -> Vec<(TopicPartition, Result<i64, String>)>;
    /// `partitions` are being taken away (`lost`: the session timed out
    /// and another member may own them already). Stop writing them before
    /// returning.
    fn revoked(&self, partitions: &[TopicPartition], lost: bool);
}

/// A start "at the log start offset" from [`Membership::assigned`]
/// (Kafka's `OFFSET_BEGINNING`).
pub const START_EARLIEST: i64 = -2;
/// A start "at the high watermark" (Kafka's `OFFSET_END`).
pub const START_LATEST: i64 = -1;

/// What changed in the assignment since it was last taken, for the
/// fetching side.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct AssignmentChanges {
    /// Newly assigned partitions and the offset each starts at.
    pub assigned: BTreeMap<TopicPartition, i64>,
    /// Partitions taken away, in order; also those assigned again since
    /// (they are in `assigned` as well: revoked first, then assigned).
    pub revoked: Vec<TopicPartition>,
    /// Claims that failed: the member must stop.
    pub failed: Vec<(TopicPartition, String)>,
}

/// The consumer's context: rust-rdkafka's default behaviour, or group
/// membership when a [`Membership`] is set.
#[derive(Default)]
pub struct SourceContext {
    membership: Option<Arc<dyn Membership>>,
    /// Connection failures its client reported (shared by a source's
    /// clients).
    errors: Arc<ClientErrors>,
    /// The partitions held now, with their start offsets when assigned.
    held: Mutex<BTreeMap<TopicPartition, i64>>,
    changes: Mutex<AssignmentChanges>,
    /// Rebalance callbacks run so far: one or more means the member is in
    /// the group; a fetch reads it after every poll to apply a rebalance
    /// before the records that follow it.
    rebalances: std::sync::atomic::AtomicU64,
}

impl SourceContext {
    /// A context for a group member answering rebalances with `m`.
    pub fn member(m: Arc<dyn Membership>) -> Self {
        SourceContext {
            membership: Some(m),
            ..SourceContext::default()
        }
    }

    /// This context, reporting connection failures into `errors`.
    pub(super) fn with_errors(mut self, errors: Arc<ClientErrors>) -> Self {
        self.errors = errors;
        self
    }

    /// Whether the coordinator has given this member an assignment yet
    /// (possibly empty).
    pub fn rebalanced(&self) -> bool {
        self.rebalances() > 0
    }

    /// How many rebalance callbacks have run (cheap: one atomic load).
    pub fn rebalances(&self) -> u64 {
        self.rebalances.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Whether this is a group member's context.
    pub fn is_member(&self) -> bool {
        self.membership.is_some()
    }

    /// The partitions this member holds now.
    pub fn held(&self) -> Vec<TopicPartition> {
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect()
    }

    /// Take the changes since the last call.
    pub fn take_changes(&self) -> AssignmentChanges {
        std::mem::take(&mut *self.changes.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn assign(
        &self,
        m: &dyn Membership,
        consumer: &BaseConsumer<Self>,
        tpl: &TopicPartitionList,
    ) -> KafkaResult<()> {
        let parts = partitions(tpl);
        let claims = m.assigned(&parts, &member_id(consumer));
        let claims = concrete_starts(consumer, claims);
        let mut take = TopicPartitionList::new();
        let mut changes = self.changes.lock().unwrap_or_else(|p| p.into_inner());
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        for ((topic, partition), claim) in claims {
            match claim {
                Ok(start) => {
                    take.add_partition_offset(&topic, partition, Offset::Offset(start))?;
                    held.insert((topic.clone(), partition), start);
                    // A partition revoked and assigned again since the
                    // last take stays in `revoked` too: what was read of
                    // it before belongs to the old assignment.
                    changes.assigned.insert((topic, partition), start);
                }
                Err(why) => changes.failed.push(((topic, partition), why)),
            }
        }
        drop((changes, held));
        match consumer.rebalance_protocol() {
            RebalanceProtocol::Cooperative => consumer.incremental_assign(&take),
            _ => consumer.assign(&take),
        }
    }

    fn revoke(
        &self,
        m: &dyn Membership,
        consumer: &BaseConsumer<Self>,
        tpl: &TopicPartitionList,
    ) -> KafkaResult<()> {
        let parts = partitions(tpl);
        m.revoked(&parts, consumer.assignment_lost());
        {
            let mut changes = self.changes.lock().unwrap_or_else(|p| p.into_inner());
            let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
            for tp in &parts {
                held.remove(tp);
                changes.assigned.remove(tp);
                changes.revoked.push(tp.clone());
            }
        }
        match consumer.rebalance_protocol() {
            RebalanceProtocol::Cooperative => consumer.incremental_unassign(tpl),
            _ => consumer.unassign(),
        }
    }
}

/// Claims with [`START_EARLIEST`] or [`START_LATEST`] turned into the
/// partitions' log start offsets or high watermarks, read now with one
/// ListOffsets request (timestamps -2 and -1; the last stable offset under
/// `read_committed`). A claim whose offset cannot be read fails (the member
/// stops and says why).
///
/// A partition is never assigned at a logical offset: librdkafka 2.12.1
/// resolves one with an asynchronous ListOffsets, and when the planner's
/// seek to the planned start lands while that request is in flight, the
/// outdated answer restarts the lookup and moves the fetch position to
/// the logical offset after the seek (librdkafka issue #2256, seen here
/// on nisshi: a partition added to the topic, assigned at the end and
/// planned from 0, stalled at its second range). Forward, the rest of the
/// planned range would be jumped over; backward, read twice.
fn concrete_starts(
    consumer: &BaseConsumer<SourceContext>,
    claims: Vec<(TopicPartition, Result<i64, String>)>,
) -> Vec<(TopicPartition, Result<i64, String>)> {
    let logical: Vec<(TopicPartition, i64)> = claims
        .iter()
        .filter_map(|(tp, c)| match c {
            Ok(at @ (START_EARLIEST | START_LATEST)) => Some((tp.clone(), *at)),
            _ => None,
        })
        .collect();
    if logical.is_empty() {
        return claims;
    }
    let mut ask = TopicPartitionList::new();
    for ((t, p), at) in &logical {
        // ListOffsets' timestamps -2 and -1 are Kafka's "earliest" and
        // "latest"; `Offset::Beginning` and `Offset::End` carry them.
        let ts = if *at == START_EARLIEST {
            Offset::Beginning
        } else {
            Offset::End
        };
        if let Err(e) = ask.add_partition_offset(t, *p, ts) {
            tracing::debug!("ListOffsets request for {t}/{p}: {e}");
        }
    }
    // The coordinator's assignment can name partitions this consumer's
    // metadata does not know yet (a partition just added, seen by the
    // leader first): librdkafka then refuses the lookup locally with
    // UnknownPartition. Refresh the topics' metadata and ask again.
    let topics: std::collections::BTreeSet<&str> =
        logical.iter().map(|((t, _), _)| t.as_str()).collect();
    let mut answer = consumer.offsets_for_times(ask.clone(), LIST_OFFSETS_TIMEOUT);
    for _ in 0..LIST_OFFSETS_TRIES {
        if logical.iter().all(|(tp, _)| answered(&answer, tp).is_ok()) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
        for t in &topics {
            if let Err(e) = consumer.fetch_metadata(Some(t), LIST_OFFSETS_TIMEOUT) {
                tracing::debug!("metadata of {t}: {e}");
            }
        }
        answer = consumer.offsets_for_times(ask.clone(), LIST_OFFSETS_TIMEOUT);
    }
    claims
        .into_iter()
        .map(|(tp, c)| {
            let c = match c {
                Ok(at @ (START_EARLIEST | START_LATEST)) => {
                    let which = if at == START_EARLIEST {
                        "log start offset"
                    } else {
                        "high watermark"
                    };
                    let got = answered(&answer, &tp);
                    got.map_err(|e| {
                        format!(
                            "could not read the {which} of {}/{} to start reading it (ListOffsets: {e}); \
                             the member stops so that another one, or this one restarted, claims it",
                            tp.0, tp.1
                        )
                    })
                }
                c => c,
            };
            (tp, c)
        })
        .collect()
}

/// The offset a ListOffsets `answer` gives `tp`, or why there is none.
fn answered(
    answer: &rdkafka::error::KafkaResult<TopicPartitionList>,
    tp: &TopicPartition,
) -> Result<i64, String> {
    let tpl = answer.as_ref().map_err(|e| e.to_string())?;
    match tpl
        .find_partition(&tp.0, tp.1)
        .map(|e| (e.error(), e.offset()))
    {
        Some((Ok(()), Offset::Offset(o))) if o >= 0 => Ok(o),
        Some((Err(e), _)) => Err(e.to_string()),
        other => Err(format!("no offset in the answer ({other:?})")),
    }
}

/// How long [`concrete_starts`] waits for the broker's answer.
const LIST_OFFSETS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// How often [`concrete_starts`] asks again after refreshing metadata.
const LIST_OFFSETS_TRIES: usize = 3;

/// The member id the group coordinator gave `consumer` (KIP-394: the
/// coordinator assigns it at the first JoinGroup), empty before it joined.
/// rust-rdkafka 0.39 has no safe wrapper for `rd_kafka_memberid`.
#[allow(unsafe_code)]
fn member_id(consumer: &BaseConsumer<SourceContext>) -> String {
    let rk = consumer.client().native_ptr();
    // SAFETY: `rk` is the live handle of `consumer`, borrowed for the call.
    // `rd_kafka_memberid` returns NULL or a NUL-terminated copy that the
    // caller owns and frees with `rd_kafka_mem_free`, once, here.
    unsafe {
        let p = rdkafka::bindings::rd_kafka_memberid(rk);
        if p.is_null() {
            return String::new();
        }
        let id = std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned();
        rdkafka::bindings::rd_kafka_mem_free(rk, p.cast());
        id
    }
}

/// The (topic, partition) pairs of `tpl`.
fn partitions(tpl: &TopicPartitionList) -> Vec<TopicPartition> {
    tpl.elements()
        .iter()
        .map(|e| (e.topic().to_string(), e.partition()))
        .collect()
}

impl ClientContext for SourceContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        client_log(&self.errors, level, fac, log_message);
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        client_error(&self.errors, error, reason);
    }
}

impl ConsumerContext for SourceContext {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        let Some(m) = self.membership.as_deref() else {
            // Manual assignment never rebalances; should a group form
            // anyway, do what rust-rdkafka would.
            let r = match err {
                RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => consumer.assign(tpl),
                _ => consumer.unassign(),
            };
            if let Err(e) = r {
                tracing::warn!("rebalance outside a group: {e}");
            }
            return;
        };
        let r = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => self.assign(m, consumer, tpl),
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => self.revoke(m, consumer, tpl),
            other => {
                tracing::warn!("consumer group rebalance error: {other:?}");
                // librdkafka's advice for an error: drop the assignment.
                self.revoke(m, consumer, tpl)
            }
        };
        self.rebalances
            .fetch_add(1, std::sync::atomic::Ordering::Release);
        if let Err(e) = r {
            tracing::error!("consumer group rebalance could not be applied: {e}");
        }
    }
}
