//! The micro-batch loop of a pipeline group's member (`host run --group`,
//! DESIGN.md "Scale beyond one machine: pipeline groups").
//!
//! Kafka's group coordinator assigns the partitions; each is claimed in
//! the sink database when it is assigned ([`Member::assigned`]: the
//! owner epoch goes up, the previous owner is fenced). Each batch plans
//! only the partitions held: a range planned and not finished (by this
//! member or the previous owner) is run again with the same bounds, the
//! others continue at the end their progress row shows applied. The
//! write-ahead and the commit are the group store's `plan` and `finish`,
//! each under the partition's owner epoch; every sink part checks it in
//! its own transaction. A fenced partition is dropped, not retried.
//!
//! A rebalance during a batch takes only the partitions it revokes: their
//! part in flight ends before the revoke is acknowledged, the rest of
//! their planned ranges is left to the next owner, and the batch goes on
//! with the other partitions and commits them (`engine::revoke`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::capability::sql::{self, SqlGrant};
use crate::checkpoint::group::{GroupError, GroupStore, Planned};
use crate::checkpoint::{Epoch, Fingerprint, OffsetsEntry};
use crate::metrics::Metrics;
use crate::plugin::Runtime;
use crate::sink::{SinkDriver, SinkError};
use crate::source::{
    KafkaSource, Membership, PartitionRange, START_EARLIEST, START_LATEST, TopicPartition,
};
use crate::util::now_ms;

use super::batch::{BatchEnv, run_batch};
use super::config::StartingOffsets;
use super::policy::on_data_loss;
use super::progress::{Progress, ms};
use super::revoke::{DRAIN_WAIT, Revocations};
use super::stages::{assemble, load_plugins, show_refs};
use super::{EngineError, PipelineConfig, RunSummary};

mod swap;

/// A partition this member holds.
#[derive(Debug, Clone)]
struct Held {
    epoch: Epoch,
    /// The next offset to plan ([`START_EARLIEST`]/[`START_LATEST`] until
    /// resolved).
    next: i64,
    /// A range to run again with these bounds.
    planned: Option<Planned>,
}

/// The member's answers to the coordinator, and what it holds.
struct Member {
    store: Arc<GroupStore>,
    driver: Arc<SinkDriver>,
    group: String,
    owner: String,
    /// Where a partition with no progress row starts: `--starting-offsets`
    /// during the first assignment of a new group, the log start after
    /// that (partitions that appear later, as the design says).
    starting: Mutex<StartingOffsets>,
    held: Mutex<BTreeMap<TopicPartition, Held>>,
    /// The Kafka member id the coordinator gave this member (recorded
    /// with each claim).
    member_id: Mutex<String>,
    /// The partitions a rebalance takes during a batch, and the part in
    /// flight a revoke waits for.
    revocations: Revocations,
}

impl Member {
    fn held(&self) -> BTreeMap<TopicPartition, Held> {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn update(&self, tp: &TopicPartition, f: impl FnOnce(&mut Held)) {
        if let Some(h) = self
            .held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(tp)
        {
            f(h);
        }
    }

    /// When `e` says another member holds one of our partitions now: drop
    /// it (logged) and answer true. When it was `host group reset` that
    /// took it (the partition is still assigned to this member), claim it
    /// again: the claim reads the position the reset left.
    fn drop_if_fenced(&self, e: &GroupError) -> bool {
        let GroupError::Fenced {
            topic,
            partition,
            holder,
            now,
            ..
        } = e
        else {
            return false;
        };
        let tp = (topic.clone(), *partition);
        let gone = now.get() == 0;
        if gone || holder.starts_with(crate::checkpoint::group::RESET_OWNER) {
            tracing::warn!(
                topic,
                partition,
                "{}: claiming the partition again",
                if gone {
                    "its row in sluice_partitions is gone".to_string()
                } else {
                    format!("the group was reset ({holder})")
                }
            );
            match self.claim(&tp) {
                Ok(h) => {
                    self.held
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(tp, h);
                    return true;
                }
                Err(why) => tracing::warn!(
                    topic,
                    partition,
                    "could not claim it again, dropping it: {why}"
                ),
            }
        } else {
            tracing::warn!(topic, partition, "{e}");
        }
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&tp);
        true
    }

    fn claim(&self, (topic, partition): &TopicPartition) -> Result<Held, String> {
        let member_id = self
            .member_id
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        // The progress is read in the claim's transaction, on the group
        // store's connection: the sink's may have a part's transaction
        // open (a claim comes from a rebalance during a batch).
        let (c, applied) = self
            .store
            .claim_reading(topic, *partition, (&self.owner, &member_id), |b| {
                let applied = self
                    .driver
                    .applied_end_and_epoch_on(b, &self.group, topic, *partition)
                    .map_err(|error| GroupError::Db {
                        group: self.group.clone(),
                        during: "reading the partition's progress (sluice_progress)",
                        error,
                    })?;
                Ok((applied, applied.map(|(_, e)| e).unwrap_or_default()))
            })
            .map_err(|e| e.to_string())?;
        let next = match (&c.planned, applied) {
            (Some(p), _) => p.start,
            (None, Some((end, _))) => end,
            (None, None) => match *self.starting.lock().unwrap_or_else(|p| p.into_inner()) {
                StartingOffsets::Earliest => START_EARLIEST,
                StartingOffsets::Latest => START_LATEST,
            },
        };
        let from = match next {
            START_EARLIEST => "the log start (earliest)".to_string(),
            START_LATEST => "the high watermark (latest)".to_string(),
            n => format!("offset {n}"),
        };
        tracing::info!(
            topic,
            partition,
            epoch = c.epoch.get(),
            previous_owner = c.previous_owner,
            rerun = c.planned.is_some(),
            "claimed; reading from {from}"
        );
        Ok(Held {
            epoch: c.epoch,
            next,
            planned: c.planned,
        })
    }
}

impl Membership for Member {
    fn assigned(
        &self,
        partitions: &[TopicPartition],
        member_id: &str,
    ) -> Vec<(TopicPartition, Result<i64, String>)> {
        *self.member_id.lock().unwrap_or_else(|p| p.into_inner()) = member_id.to_string();
        let claims = partitions
            .iter()
            .map(|tp| {
                let claimed = self.claim(tp).map(|h| {
                    let next = h.next;
                    self.held
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(tp.clone(), h);
                    next
                });
                (tp.clone(), claimed)
            })
            .collect();
        if !partitions.is_empty() {
            *self.starting.lock().unwrap_or_else(|p| p.into_inner()) = StartingOffsets::Earliest;
        }
        claims
    }

    fn revoked(&self, partitions: &[TopicPartition], lost: bool) {
        // Drain, then release: no part of them starts from now on, and the
        // one in flight ends before the revoke is acknowledged.
        self.revocations.revoke(partitions, lost, DRAIN_WAIT);
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        for tp in partitions {
            held.remove(tp);
            tracing::info!(topic = %tp.0, partition = tp.1, lost, "revoked");
        }
    }
}

/// Run as a member of pipeline group `cfg.group` until `stop` is set (or,
/// with `until_caught_up`, until every partition held is read up to its
/// high watermark); leaving the group hands the partitions to the others.
///
/// # Errors
/// [`EngineError`]: the sink database (the group's checkpoint) down or
/// refusing, a group running other topics, a plugin or Kafka failure.
pub fn run_group(cfg: &PipelineConfig, stop: Arc<AtomicBool>) -> Result<RunSummary, EngineError> {
    let Some(group) = cfg.group.clone() else {
        return Err(EngineError::Config("run_group needs --group".into()));
    };
    let Some(url) = cfg.sink_db.clone() else {
        return Err(EngineError::Config(format!(
            "--group {group} needs --sink-db: a pipeline group keeps its checkpoint (owners, planned ranges, progress) in the sink database"
        )));
    };
    let db_err = |error| EngineError::SinkDb {
        url: sql::redact(&url),
        error,
    };
    let runtime = Arc::new(Runtime::new(cfg.limits).map_err(EngineError::Config)?);
    let grant =
        SqlGrant::connect_with(&url, cfg.sink_db_password_file.as_deref()).map_err(db_err)?;
    grant
        .limit_statements(cfg.limits.call_timeout)
        .and_then(|()| grant.set_host_schema(cfg.sink_schema.clone()))
        .and_then(|()| grant.set_plugin_role(cfg.sink_plugin_role.clone()))
        .map_err(db_err)?;
    let schema = grant.host_schema();
    let store = Arc::new(
        GroupStore::open(&url, cfg.sink_db_password_file.as_deref(), &schema, &group)?
            .retry_for(cfg.sink_retry_for),
    );
    // The last swap asked before this member reads the group's plugins:
    // one asked while it starts is installed at its first batch boundary.
    let swaps_before = store.latest_swap()?.map_or(0, |s| s.id);
    // Without --plugin a member runs the group's current plugins, read
    // from the group's store; with --plugin it brings its own (a rolling
    // upgrade when they differ), and the group records them for the
    // members that come next.
    let fingerprint = Fingerprint::new(&cfg.topics);
    let recorded = if cfg.plugins.is_empty() {
        let current = store.join(&fingerprint, &[])?;
        if current.is_empty() {
            return Err(EngineError::Config(format!(
                "no plugins: pass --plugin FILE (group {group} records none for new members to take)"
            )));
        }
        current
    } else {
        Vec::new()
    };
    let stored = |digest: &str| {
        store
            .load_plugin(digest)
            .map(|bytes| {
                (
                    std::path::PathBuf::from(format!("group {group}: {digest}")),
                    bytes,
                )
            })
            .map_err(|e| crate::checkpoint::CheckpointError::Corrupt {
                file: std::path::PathBuf::from(format!("sluice_group_plugins {digest}")),
                reason: e.to_string(),
            })
    };
    let loaded = load_plugins(cfg, &runtime, &recorded, &stored)?;
    let mut stages = assemble(cfg, &loaded, &recorded, Some(&grant))?;
    if !cfg.plugins.is_empty() {
        let current = store.join(&fingerprint, &stages.refs)?;
        let has_sink = |refs: &[crate::checkpoint::PluginRef]| {
            refs.iter()
                .any(|r| r.stage == crate::checkpoint::StageKind::Sink)
        };
        if has_sink(&current) && !has_sink(&stages.refs) {
            return Err(EngineError::Config(format!(
                "group {group} runs a sink stage and this member's plugins have none: it would record records as applied without writing them. Give it the group's sink plugin (or start it without --plugin to take the group's plugins)"
            )));
        }
        if !current.is_empty() && current != stages.refs {
            // The group's plugins are its own (a swap, an earlier
            // upgrade): a member restarted with older files must not put
            // the group back on them unasked.
            if !cfg.upgrade {
                let by = match store.latest_swap()? {
                    Some(s) if s.plugins == current => format!(
                        " (set by `host group swap` {}, asked by {})",
                        s.id, s.requested_by
                    ),
                    _ => String::new(),
                };
                return Err(EngineError::PluginAuthority {
                    group: group.clone(),
                    current: show_refs(&current),
                    by,
                    given: show_refs(&stages.refs),
                });
            }
            tracing::info!(
                group,
                "rolling upgrade (--upgrade): the group's plugins become [{}] instead of [{}]; members that start without --plugin take these from now on, and running members keep theirs until they stop",
                show_refs(&stages.refs),
                show_refs(&current)
            );
        }
        // Stored before they become the group's: a member that starts
        // without --plugin reads them from the store.
        for (_, bytes) in &loaded {
            store.store_plugin(bytes)?;
        }
        if current != stages.refs {
            store.set_plugins(&stages.refs)?;
        }
    } else {
        tracing::info!(group, "running the group's current plugins");
    }
    drop(loaded);
    let owner = format!("pid {} on {}", std::process::id(), crate::util::hostname());
    let driver = Arc::new(
        SinkDriver::new(Some(grant.clone()))
            .map_err(db_err)?
            .reconnect_for(cfg.sink_retry_for)
            .owner(format!("{owner}, group {group}"))
            .in_group(store.tables().clone(), group.clone()),
    );
    // A pipeline of its own (a checkpoint directory) on the same sink and
    // topics would be applied again by the group, whose progress rows are
    // its own.
    if !cfg.allow_shared_sink {
        super::startup::refuse_shared_sink(cfg, &driver, &group, Some(&sql::redact(&url)))?;
    }
    if let Some(role) = grant.plugin_role() {
        grant
            .check_plugin_role(&role, &store.tables().all())
            .map_err(db_err)?;
    }
    // --starting-offsets is for the partitions of a new group; a partition
    // added to a running group's topics starts at its log start, as the
    // design says of partitions discovered later.
    let starting = if store.partitions()?.is_empty() {
        cfg.starting_offsets
    } else {
        StartingOffsets::Earliest
    };
    let member = Arc::new(Member {
        store: store.clone(),
        driver: driver.clone(),
        group: group.clone(),
        owner,
        starting: Mutex::new(starting),
        held: Mutex::new(BTreeMap::new()),
        member_id: Mutex::new(String::new()),
        revocations: Revocations::default(),
    });
    let mut source = KafkaSource::member(
        &cfg.brokers,
        &cfg.kafka,
        &group,
        &cfg.topics,
        member.clone(),
        // Offsets are committed to the Kafka group too, for lag dashboards
        // and tools that read them (the database stays the checkpoint).
        true,
        cfg.kafka_timeout,
    )?;
    tracing::info!(group, "joined the pipeline group");
    let metrics = Arc::new(Metrics::in_group(&group, &member.owner));
    let _metrics_server = match cfg.metrics_addr {
        Some(addr) => Some(
            crate::metrics::MetricsServer::start(addr, metrics.clone())
                .map_err(EngineError::Config)?,
        ),
        None => None,
    };
    let mut swaps = swap::GroupSwaps::start(
        store.clone(),
        runtime.clone(),
        member.owner.clone(),
        &stages,
        swaps_before,
    )?;
    let r = run_member(
        cfg,
        &stop,
        &mut source,
        &mut stages,
        &mut swaps,
        &member,
        &grant,
        &metrics,
    );
    if r.is_ok() {
        commit_before_leaving(&mut source, &member);
    }
    swaps.leave();
    drop(source);
    r
}

/// How long a member that leaves tries to commit its applied ends to the
/// Kafka group (informational offsets; the database is the checkpoint).
const LEAVING_COMMIT_FOR: Duration = Duration::from_secs(15);

/// Commit the ends applied of the partitions held to the Kafka group and
/// wait for the answer, before the member leaves. A coordinator in the
/// middle of a rebalance refuses commits (`RebalanceInProgress`,
/// `IllegalGeneration`: another member just left or joined), so the
/// member serves the group and tries again, for up to
/// [`LEAVING_COMMIT_FOR`]; after that it leaves without (logged).
fn commit_before_leaving(source: &mut KafkaSource, member: &Member) {
    let until = Instant::now() + LEAVING_COMMIT_FOR;
    loop {
        let ends: BTreeMap<TopicPartition, i64> = member
            .held()
            .into_iter()
            .filter(|(_, h)| h.planned.is_none() && h.next >= 0)
            .map(|(tp, h)| (tp, h.next))
            .collect();
        match source.commit_group_sync(&ends) {
            Ok(()) => return,
            Err(e) if Instant::now() < until => {
                tracing::debug!(
                    "committing the applied ends to the Kafka group: {e}; trying again"
                );
                let pause = Instant::now() + Duration::from_millis(250);
                while Instant::now() < pause {
                    source.serve(Duration::from_millis(50));
                }
            }
            Err(e) => {
                tracing::info!(
                    "the applied ends were not committed to the Kafka group ({e}); they are informational only, the sink database holds the checkpoint"
                );
                return;
            }
        }
    }
}

/// Take the assignment changes since the last call ([`KafkaSource::sync_group`])
/// and forget the metrics of the partitions revoked.
///
/// # Errors
/// [`EngineError::Claim`] for a claim that failed: Kafka counts the
/// partition as this member's, but nobody would read it, so the member
/// stops.
fn sync_group(
    source: &mut KafkaSource,
    metrics: &Metrics,
) -> Result<crate::source::AssignmentChanges, EngineError> {
    let changes = source.sync_group();
    if let Some((tp, why)) = changes.failed.first() {
        return Err(EngineError::Claim {
            topic: tp.0.clone(),
            partition: tp.1,
            why: why.clone(),
        });
    }
    for tp in &changes.revoked {
        metrics.forget_partition(tp);
    }
    Ok(changes)
}

/// The batch loop of [`run_group`].
#[allow(clippy::too_many_arguments)]
fn run_member(
    cfg: &PipelineConfig,
    stop: &Arc<AtomicBool>,
    source: &mut KafkaSource,
    stages: &mut super::stages::Stages,
    swaps: &mut swap::GroupSwaps,
    member: &Member,
    grant: &SqlGrant,
    metrics: &Metrics,
) -> Result<RunSummary, EngineError> {
    let (store, driver, group) = (&member.store, &member.driver, &member.group);
    let mut summary = RunSummary::default();
    let mut batch_id = 0u64;
    let started_at = Instant::now();
    let mut joined_at = Instant::now();
    // A join can wait out a rebalance that waits out a departed member's
    // session timeout (librdkafka's mock cluster does so even after a
    // LeaveGroup), twice in a row.
    let session = cfg
        .kafka
        .get("session.timeout.ms")
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(45_000);
    let join_wait = cfg
        .kafka_timeout
        .max(Duration::from_secs(60))
        .max(Duration::from_millis(2 * session) + Duration::from_secs(10));
    loop {
        if stop.load(Ordering::Relaxed) {
            tracing::info!("stop requested: the last batch is committed, leaving the group");
            break;
        }
        source.serve(Duration::from_millis(10));
        let changes = sync_group(source, metrics)?;
        if !changes.assigned.is_empty() || !changes.revoked.is_empty() {
            joined_at = Instant::now();
        }
        if swaps.at_boundary(cfg, stages, grant, batch_id + 1) {
            metrics.swap();
        }

        // Plan the partitions held. Revokes answered between batches are
        // in `held` already.
        member.revocations.take();
        let started = Instant::now();
        let held = member.held();
        let mut ranges = Vec::new();
        let mut epochs = BTreeMap::new();
        let mut gaps = Vec::new();
        let mut lag = BTreeMap::new();
        let mut rerun = false;
        for (tp, h) in &held {
            let (start, end) = match &h.planned {
                Some(p) => {
                    rerun = true;
                    let (_, high) = source.watermarks(&tp.0, tp.1)?;
                    lag.insert(tp.clone(), (high - p.end).max(0));
                    (p.start, p.end)
                }
                None => {
                    let (low, high) = source.watermarks(&tp.0, tp.1)?;
                    let next = match h.next {
                        START_EARLIEST => low,
                        START_LATEST => {
                            // Recorded, so that whoever holds the partition
                            // next starts there too, not at its log start.
                            match driver.start_at(group, &tp.0, tp.1, h.epoch, high) {
                                Err(SinkError::Group(e)) if member.drop_if_fenced(&e) => continue,
                                r => r?,
                            }
                            high
                        }
                        n if n < low => {
                            gaps.push(on_data_loss(
                                cfg.on_data_loss,
                                &tp.0,
                                tp.1,
                                (n, low),
                                "group member",
                            )?);
                            low
                        }
                        n if n > high => {
                            // Nothing can be read there: a reset past the
                            // log, or a topic deleted and created again.
                            return Err(EngineError::BeyondEnd {
                                topic: tp.0.clone(),
                                partition: tp.1,
                                position: n,
                                high,
                                reset: cfg.reset_command(&tp.0),
                            });
                        }
                        n => n,
                    };
                    if next != h.next {
                        member.update(tp, |h| h.next = next);
                    }
                    let max = i64::try_from(cfg.max_records_per_partition).unwrap_or(i64::MAX);
                    let end = high.min(next.saturating_add(max));
                    lag.insert(tp.clone(), high - end);
                    (next, end)
                }
            };
            if end > start {
                ranges.push(PartitionRange {
                    topic: tp.0.clone(),
                    partition: tp.1,
                    start,
                    end,
                });
                epochs.insert(tp.clone(), h.epoch);
            }
        }
        if ranges.is_empty() {
            // Caught up: with --until-caught-up, once the assignment has
            // been stable for a moment (a rebalance may still hand over
            // partitions with work left).
            // A member that the coordinator gives nothing (more members
            // than partitions) is done too, once the group had time to
            // assign it something.
            let joined = source.context().rebalanced();
            if !joined && started_at.elapsed() > join_wait {
                return Err(EngineError::Source(crate::source::SourceError::Client(
                    format!(
                        "no assignment from the consumer group {group} after {} s: the group coordinator did not let this member join (check the brokers, the group name and the broker's log)",
                        started_at.elapsed().as_secs()
                    ),
                )));
            }
            if cfg.until_caught_up
                && joined
                && joined_at.elapsed() > Duration::from_secs(3)
                && (!held.is_empty() || started_at.elapsed() > Duration::from_secs(15))
            {
                tracing::info!("caught up on every partition held");
                break;
            }
            let until = Instant::now() + cfg.trigger_interval;
            while Instant::now() < until && !stop.load(Ordering::Relaxed) {
                source.serve(Duration::from_millis(50));
            }
            continue;
        }

        // Write ahead, under each partition's owner epoch.
        batch_id += 1;
        let parts: Vec<(String, i32, Epoch, Planned)> = ranges
            .iter()
            .map(|r| {
                let epoch = epochs[&(r.topic.clone(), r.partition)];
                (
                    r.topic.clone(),
                    r.partition,
                    epoch,
                    Planned {
                        batch: batch_id,
                        start: r.start,
                        end: r.end,
                        plugins: stages.refs.clone(),
                    },
                )
            })
            .collect();
        if let Err(e) = store.plan(&parts) {
            if member.drop_if_fenced(&e) {
                continue;
            }
            return Err(e.into());
        }
        for (topic, partition, _, planned) in &parts {
            member.update(&(topic.clone(), *partition), |h| {
                h.planned = Some(planned.clone())
            });
        }
        let entry = OffsetsEntry {
            batch_id,
            epoch: epochs.values().copied().max().unwrap_or_default(),
            planned_at_ms: now_ms(),
            ranges: ranges.clone(),
            plugins: stages.refs.clone(),
            config_digest: String::new(),
            note: None,
            topics: BTreeMap::new(),
            sink_db: None,
        };
        let plan_ms = ms(started.elapsed());

        // Fetch, map and sink.
        let done = run_batch(
            BatchEnv {
                cfg,
                source,
                stages,
                driver,
                query_id: group,
                epoch: entry.epoch,
                epochs: Some(&epochs),
                revocations: Some(&member.revocations),
                metrics,
                stop,
            },
            &entry,
            rerun,
        );
        // Partitions taken during the batch: revoked (drained and
        // released already) or fenced by the database.
        let (dropped, fenced) = member.revocations.take();
        for e in &fenced {
            member.drop_if_fenced(e);
        }
        let done = match done {
            Ok(d) => d,
            Err(EngineError::Sink(SinkError::Group(e))) if member.drop_if_fenced(&e) => continue,
            Err(e) => {
                // A claim that failed during the batch stops the member
                // (as at the top of the loop).
                let changes = sync_group(source, metrics).inspect_err(|_| {
                    tracing::error!("batch {batch_id} failed: {e}");
                })?;
                // A rebalance drains and releases the revoked partitions
                // without failing the batch; only a read of a partition
                // taken while it was being read may still end it. Its
                // planned range is run by whoever holds it now.
                let took = changes.revoked.iter().any(|tp| {
                    ranges
                        .iter()
                        .any(|r| r.topic == tp.0 && r.partition == tp.1)
                });
                if took && matches!(e, EngineError::Source(_)) {
                    tracing::info!("a rebalance took a partition of batch {batch_id}: {e}");
                    continue;
                }
                return Err(e);
            }
        };

        // Commit the partitions still ours: clear their planned ranges,
        // still under our epochs. A dropped partition's planned range is
        // left to its next owner.
        let commit_started = Instant::now();
        if !dropped.is_empty() {
            let names: Vec<String> = dropped.iter().map(|(t, p)| format!("{t}/{p}")).collect();
            tracing::info!(
                batch = batch_id,
                "committing batch {batch_id} without {}: taken from this member during the batch; its next owner runs the rest of the planned range",
                names.join(", ")
            );
        }
        let kept = |t: &String, p: &i32| !dropped.contains(&(t.clone(), *p));
        let finished: Vec<(String, i32, Epoch)> = parts
            .iter()
            .filter(|(t, p, _, _)| kept(t, p))
            .map(|(t, p, e, _)| (t.clone(), *p, *e))
            .collect();
        let ranges: Vec<PartitionRange> = ranges
            .into_iter()
            .filter(|r| kept(&r.topic, &r.partition))
            .collect();
        lag.retain(|(t, p), _| kept(t, p));
        let entry = OffsetsEntry {
            ranges: ranges.clone(),
            ..entry
        };
        // A partition another member took meanwhile is dropped; the others
        // are finished all the same.
        for e in store.finish(batch_id, &finished)? {
            member.drop_if_fenced(&e);
        }
        for r in &ranges {
            member.update(&(r.topic.clone(), r.partition), |h| {
                h.planned = None;
                h.next = r.end;
            });
        }
        // The ends applied, of the partitions still held, to the Kafka
        // group (informational: never read back).
        let still = member.held();
        let applied: BTreeMap<TopicPartition, i64> = super::ends(&ranges)
            .into_iter()
            .filter(|(tp, _)| still.contains_key(tp))
            .collect();
        source.commit_group(&applied);
        let mut timings = done.timings;
        timings.plan = plan_ms;
        timings.commit = ms(commit_started.elapsed());
        gaps.extend(done.gaps);
        summary.batches += 1;
        summary.last_batch = Some(batch_id);
        summary.counts.add(&done.counts);
        summary
            .plugins_per_batch
            .push((batch_id, stages.refs.clone()));
        metrics.batch(&done.counts, &timings, rerun, &lag);
        Progress::new(
            &entry,
            entry.epoch,
            rerun,
            &done.counts,
            &timings,
            started.elapsed(),
            lag,
            &gaps,
        )
        .in_group(group, &member.owner)
        .emit(cfg.progress);
    }
    Ok(summary)
}
