//! Opening a pipeline group's store for a member (`host run --group`):
//! the group's tables in the sink database, its fingerprint, its plugins
//! (plugin authority: a member runs the group's, or changes them only
//! with `--upgrade`), and the member that answers the coordinator.

use std::sync::Arc;

use crate::checkpoint::group::{DbStore, GroupError, GroupStore};
use crate::checkpoint::{Checkpoint, Fingerprint, PluginRef, StageKind};
use crate::plugin::Runtime;
use crate::sink::SinkDriver;

use super::Member;
use crate::engine::open::Acquire;
use crate::engine::open::{connect_sink, refuse_shared_sink, sink_db_error};
use crate::engine::ownership::{Open, Opened};
use crate::engine::plan::Holdings;
use crate::engine::stages::{assemble, load_plugins, show_refs};
use crate::engine::{EngineError, PipelineConfig};
use crate::output::{OutputGuarantee, TransactionScope};

/// Open group `group`'s store in `cfg`'s sink database, check this
/// member's pipeline against it and settle the plugins to run.
///
/// # Errors
/// [`EngineError::Config`] without `--sink-db` or plugins;
/// [`EngineError::SinkDb`]; [`EngineError::Group`] (another pipeline
/// under that name, the database); [`EngineError::PluginAuthority`].
fn join(
    cfg: &PipelineConfig,
    group: &str,
    runtime: &Runtime,
    holdings: &Arc<Holdings>,
) -> Result<Opened, EngineError> {
    let Some(url) = cfg.sink_db.clone() else {
        return Err(EngineError::Config(format!(
            "--group {group} needs --sink-db: a pipeline group keeps its checkpoint (owners, planned ranges, progress) in the sink database"
        )));
    };
    let db_err = sink_db_error(&url);
    let grants = connect_sink(cfg)?;
    let Some(grant) = grants.first().cloned() else {
        return Err(EngineError::Config("--group needs --sink-db".into()));
    };
    let schema = grant.host_schema();
    let store = Arc::new(
        GroupStore::open(&url, cfg.sink_db_password_file.as_deref(), &schema, group)?
            .retry_for(cfg.sink_retry_for),
    );
    // The last swap asked before this member reads the group's plugins:
    // one asked while it starts is installed at its first batch boundary.
    let swaps_before = store.latest_swap()?.map_or(0, |s| s.id);
    let owner = format!("pid {} on {}", std::process::id(), crate::util::hostname());
    let driver = Arc::new(
        SinkDriver::new(Some(grant.clone()))
            .map_err(sink_db_error(&url))?
            .with_connections(grants[1..].to_vec())
            .reconnect_for(cfg.sink_retry_for)
            .owner(format!("{owner}, group {group}"))
            .in_group(store.tables().clone(), group.to_string()),
    );
    if let Some(to) = store.moved_to()? {
        return Err(GroupError::Moved {
            group: group.to_string(),
            to,
        }
        .into());
    }
    // A pipeline of its own on the same sink and topics (a checkpoint
    // directory, say this one before it became a group) would apply every
    // record again: refused before the group is created.
    if !cfg.allow_shared_sink {
        refuse_shared_sink(cfg, &driver, group)?;
    }
    refuse_other_output(cfg, &store)?;
    let cp = DbStore::new(
        store.clone(),
        driver.clone(),
        owner.clone(),
        format!("group {group} in {}", crate::capability::sql::redact(&url)),
    )?;

    // Without --plugin a member runs the group's current plugins, read
    // from the group's store; with --plugin it brings its own, which must
    // be the group's unless --upgrade says to make them the group's.
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
    let location = format!("group {group}");
    let loaded = load_plugins(cfg, runtime, (&recorded, &location), &|d: &str| {
        cp.load_plugin(d)
    })?;
    let stages = assemble(cfg, &loaded, &recorded, &grants)?;
    if !cfg.plugins.is_empty() {
        // Stored before they can become the group's (a new group records
        // them as it is created): a member that starts without --plugin
        // reads them from the store. Refused ones stay unused.
        for (_, bytes) in &loaded {
            cp.store_plugin(bytes)?;
        }
        let current = store.join(&fingerprint, &stages.refs)?;
        let has_sink = |refs: &[PluginRef]| refs.iter().any(|r| r.stage == StageKind::Sink);
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
                    group: group.to_string(),
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
        if current != stages.refs {
            store.set_plugins(&stages.refs)?;
        }
    } else {
        tracing::info!(group, "running the group's current plugins");
    }
    if let Some(role) = grant.plugin_role() {
        grant
            .check_plugin_role(&role, &store.tables().all())
            .map_err(db_err)?;
    }
    let cp: Arc<dyn Checkpoint> = Arc::new(cp);
    let member = Arc::new(Member::new(
        cp.clone(),
        holdings.clone(),
        cfg.starting_offsets,
    ));
    // Exactly once in a group commits each part's Kafka transaction
    // before its database transaction: a sink's SQL could be lost.
    if let (Some(o), Some(s)) = (
        cfg.output
            .as_ref()
            .filter(|o| o.guarantee == OutputGuarantee::ExactlyOnce),
        stages.sinks.first(),
    ) {
        return Err(EngineError::Config(format!(
            "--output-topic {} with the sink stage {} in a pipeline group: exactly once in a group is for map-only pipelines (a part's Kafka transaction commits before its database transaction, so a sink's SQL could be lost when a member stops between the two). Run the map stages only, or pass --output-guarantee at-least-once",
            o.topics.join(", "),
            s.path().display()
        )));
    }
    Ok(Opened {
        cp,
        stages,
        driver,
        scope: TransactionScope::InputPartition,
        start: Box::new(super::MemberStart {
            member,
            store,
            swaps_before,
            owner,
        }),
    })
}

/// Refuse a member whose outputs would go elsewhere than a live member's
/// (another `--output-topic`, `--output-brokers` or `--output-guarantee`,
/// or none): the group's records would be split between the two. Read
/// from the live members' own views (their heartbeat, every 5 s; a
/// member not seen for 30 s does not count), so a group whose members
/// all stopped may change its output.
///
/// # Errors
/// [`EngineError::Config`] naming the member and both outputs;
/// [`EngineError::Group`] (the database).
fn refuse_other_output(cfg: &PipelineConfig, store: &GroupStore) -> Result<(), EngineError> {
    let ours = cfg.output.as_ref().map(|o| o.identity(&cfg.brokers));
    let now = crate::util::now_ms();
    for m in store.live_members(now)? {
        let Some(live) = &m.live else { continue };
        // `host status`'s text: the identity, then its transactional ids.
        let theirs = live.get("output").and_then(|o| o.as_str()).map(|o| {
            o.split(", transactional id")
                .next()
                .unwrap_or(o)
                .to_string()
        });
        if theirs != ours {
            let show = |o: &Option<String>| {
                o.clone()
                    .unwrap_or_else(|| "no topic (no --output-topic)".to_string())
            };
            return Err(EngineError::Config(format!(
                "member {} of group {} produces to {}, and this member would produce to {}: the group's records would be split between the two. Give every member the same --output-topic, --output-brokers and --output-guarantee; to change them, stop every member first",
                m.member,
                store.group(),
                show(&theirs),
                show(&ours)
            )));
        }
    }
    Ok(())
}

/// A member's opener (see [`Open`]): joins pipeline group `.0`.
pub(in crate::engine) struct Join(pub(in crate::engine) String);

impl Open for Join {
    /// A part's dead letters commit in the sink database after its Kafka
    /// transaction: exactly once to a topic cannot cover them in a group.
    fn refuse_unfit(&self, cfg: &PipelineConfig) -> Result<(), EngineError> {
        if let Some(o) = cfg
            .output
            .as_ref()
            .filter(|o| o.guarantee == OutputGuarantee::ExactlyOnce)
            && cfg.on_error == crate::engine::ErrorPolicy::Dlq
        {
            return Err(EngineError::Config(format!(
                "--output-topic {} with --on-error dlq in a pipeline group: exactly once cannot cover both (a part's dead letters commit in the sink database after its Kafka transaction, so a member stopping between the two would lose them). Pass --on-error skip or fail, or --output-guarantee at-least-once",
                o.topics.join(", ")
            )));
        }
        Ok(())
    }

    fn open(
        self: Box<Self>,
        cfg: &PipelineConfig,
        runtime: &Arc<Runtime>,
        _acquire: Acquire,
        holdings: &Arc<Holdings>,
    ) -> Result<Opened, EngineError> {
        join(cfg, &self.0, runtime, holdings)
    }
}
