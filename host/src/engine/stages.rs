//! The pipeline's plugin stages: loading the components (from `--plugin`
//! or the checkpoint's store), assembling the map chain and the sink, and
//! installing a swapped-in plugin between two batches.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::capability::kafka::KafkaGrant;
use crate::capability::sql::SqlGrant;
use crate::checkpoint::{Checkpoint, CheckpointError, PluginRef, StageKind};
use crate::plugin::{Instance, Plugin, PluginError, Runtime};

use super::{EngineError, PipelineConfig};

/// The loaded stages of the pipeline.
pub(super) struct Stages {
    /// The map chain, once per map thread (`--map-threads`): every chain
    /// holds its own instances of the same map stages, in order.
    pub(super) maps: Vec<Vec<Instance>>,
    /// The sink stage, once per sink connection (`--sink-connections`):
    /// instance `n` is granted connection `n`. Empty without a sink stage.
    pub(super) sinks: Vec<Instance>,
    /// The topics the sink stage may send to (`--output-topic`), granted
    /// to each sink instance, a swapped-in one included.
    pub(super) kafka: Option<Arc<KafkaGrant>>,
    pub(super) refs: Vec<PluginRef>,
    /// Digest → file, for messages.
    pub(super) files: BTreeMap<String, String>,
}

/// Reads a stored component by digest: where it was read from (for
/// messages) and its bytes.
pub(super) type ReadStored<'a> = &'a dyn Fn(&str) -> Result<(PathBuf, Vec<u8>), CheckpointError>;

/// Read and compile the pipeline's plugins: the `--plugin` files, or the
/// components `recorded` in the checkpoint at `location`, read by `stored` (digest → file
/// name for messages and bytes) from its content-addressed store.
pub(super) fn load_plugins(
    cfg: &PipelineConfig,
    runtime: &Runtime,
    (recorded, location): (&[PluginRef], &str),
    stored: ReadStored<'_>,
) -> Result<Vec<(Plugin, Vec<u8>)>, EngineError> {
    let config = Arc::new(cfg.plugin_config.clone());
    let mut loaded = Vec::new();
    if cfg.plugins.is_empty() {
        if recorded.is_empty() {
            return Err(EngineError::Config(format!(
                "no plugins: pass --plugin FILE ({location} records none to resume with)"
            )));
        }
        let mut seen: Vec<&str> = Vec::new();
        for r in recorded {
            if seen.contains(&r.digest.as_str()) {
                continue;
            }
            seen.push(&r.digest);
            let (path, bytes) = stored(&r.digest)?;
            let plugin = runtime
                .load_bytes(&path, &bytes, config.clone())
                .map_err(EngineError::PluginLoad)?;
            loaded.push((plugin, bytes));
        }
        tracing::info!("running the plugins recorded in {location}");
    } else {
        for path in &cfg.plugins {
            let bytes = std::fs::read(path).map_err(|source| {
                EngineError::PluginLoad(PluginError::Read {
                    path: path.clone(),
                    source,
                })
            })?;
            let plugin = runtime
                .load_bytes(path, &bytes, config.clone())
                .map_err(EngineError::PluginLoad)?;
            loaded.push((plugin, bytes));
        }
    }
    Ok(loaded)
}

/// Arrange loaded plugins into the map chain and the sink: one sink
/// instance per connection in `grants` (the sink database's; one instance
/// without a grant when there is none).
pub(super) fn assemble(
    cfg: &PipelineConfig,
    loaded: &[(Plugin, Vec<u8>)],
    recorded: &[PluginRef],
    grants: &[SqlGrant],
) -> Result<Stages, EngineError> {
    let mut refs = Vec::new();
    let mut maps: Vec<Vec<Instance>> = (0..cfg.map_threads.max(1)).map(|_| Vec::new()).collect();
    let mut sinks = Vec::new();
    let mut files = BTreeMap::new();
    let mut sink_ref: Option<String> = None;
    for (p, _) in loaded {
        files.insert(p.digest().to_string(), p.path().display().to_string());
        let wants = |stage: StageKind| {
            if cfg.plugins.is_empty() {
                recorded
                    .iter()
                    .any(|r| r.digest == p.digest() && r.stage == stage)
            } else {
                match stage {
                    StageKind::Map => p.stages().map,
                    StageKind::Sink => p.stages().sink,
                }
            }
        };
        if wants(StageKind::Map) {
            refs.push(PluginRef {
                stage: StageKind::Map,
                digest: p.digest().to_string(),
            });
            for chain in &mut maps {
                chain.push(p.instance());
            }
        }
        if wants(StageKind::Sink) {
            if let Some(other) = &sink_ref {
                return Err(EngineError::Config(format!(
                    "two plugins export a sink stage ({} and {}); a pipeline has one sink",
                    files.get(other).cloned().unwrap_or_default(),
                    p.path().display()
                )));
            }
            sink_ref = Some(p.digest().to_string());
            sinks = sink_instances(p, grants, None);
        }
    }
    if let Some(d) = sink_ref {
        refs.push(PluginRef {
            stage: StageKind::Sink,
            digest: d,
        });
    }
    if !cfg.plugins.is_empty() && !recorded.is_empty() && recorded != refs.as_slice() {
        tracing::warn!(
            "plugin upgrade: the checkpoint's last batch ran [{}], this run uses [{}]",
            show_refs(recorded),
            show_refs(&refs)
        );
    }
    if sinks.is_empty() && cfg.output.is_none() {
        tracing::warn!(
            "no plugin exports a sink stage and no --output-topic is given: mapped records are counted and discarded"
        );
    }
    Ok(Stages {
        maps,
        sinks,
        kafka: None,
        refs,
        files,
    })
}

/// `plugin`'s sink stage once per connection in `grants`, each granted
/// its own (once, without SQL, when there is no sink database), and all
/// granted the output topics `kafka`.
fn sink_instances(
    plugin: &Plugin,
    grants: &[SqlGrant],
    kafka: Option<&Arc<KafkaGrant>>,
) -> Vec<Instance> {
    let sql: Vec<Option<SqlGrant>> = if grants.is_empty() {
        vec![None]
    } else {
        grants.iter().cloned().map(Some).collect()
    };
    sql.into_iter()
        .map(|g| {
            let mut i = plugin.instance_with_sql(g);
            i.grant_kafka(kafka.cloned());
            i
        })
        .collect()
}

/// Why the sink at `path` (`digest`) cannot have `grant`.
fn cannot_send(path: &std::path::Path, digest: &str, grant: &KafkaGrant) -> String {
    let topics: Vec<&str> = grant.topics().collect();
    format!(
        "{} (sha256 {digest}) cannot send records to the output topics {} (it does not import sluice:plugin/kafka, contract 0.2.4): rebuild it with sluice-guest 0.2.4, or run without --output-topic",
        path.display(),
        topics.join(", ")
    )
}

impl Stages {
    /// Grant the sink stage (now and after a swap) the output topics.
    ///
    /// # Errors
    /// The reason, when the sink stage cannot send (built before
    /// contract 0.2.4).
    pub(super) fn grant_kafka(&mut self, grant: Arc<KafkaGrant>) -> Result<(), String> {
        if let Some(s) = self.sinks.iter().find(|s| !s.sends_records()) {
            return Err(cannot_send(s.path(), s.digest(), &grant));
        }
        for s in &mut self.sinks {
            s.grant_kafka(Some(grant.clone()));
        }
        self.kafka = Some(grant);
        Ok(())
    }
}

pub(super) fn show_refs(v: &[PluginRef]) -> String {
    v.iter()
        .map(|r| {
            format!(
                "{:?} sha256:{}",
                r.stage,
                &r.digest[..12.min(r.digest.len())]
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

pub(super) fn config_digest(cfg: &PipelineConfig) -> String {
    let v = serde_json::json!({
        "plugin_config": cfg.plugin_config,
        "on_error": format!("{:?}", cfg.on_error),
    });
    hex::encode(Sha256::digest(v.to_string().as_bytes()))
}

/// Which stages a swap replaces in a pipeline running `refs`: the map
/// stage's index (0-based, among the map stages) and whether the sink,
/// for a plugin `plugin` (path, digest: for messages) exporting `offers`;
/// `stage` and `index` as `host swap --stage/--index` give them (default:
/// every stage the plugin exports).
///
/// # Errors
/// A message saying why the plugin cannot replace what was asked.
pub fn swap_targets(
    refs: &[PluginRef],
    plugin: (&std::path::Path, &str),
    offers: crate::plugin::Exports,
    stage: Option<StageKind>,
    index: Option<usize>,
) -> Result<(Option<usize>, bool), String> {
    let (path, digest) = plugin;
    let lacks = |what: &str| {
        format!(
            "plugin {} (sha256:{digest}) exports no {what} stage",
            path.display()
        )
    };
    let want_map = match stage {
        Some(StageKind::Map) if !offers.map => return Err(lacks("map")),
        Some(StageKind::Map) => true,
        Some(StageKind::Sink) => false,
        None => offers.map,
    };
    let want_sink = match stage {
        Some(StageKind::Sink) if !offers.sink => return Err(lacks("sink")),
        Some(StageKind::Sink) => true,
        Some(StageKind::Map) => false,
        None => offers.sink,
    };
    let maps = refs.iter().filter(|r| r.stage == StageKind::Map).count();
    let map_index = if want_map {
        let i = match (index, maps) {
            (Some(i), n) if i < n => i,
            (Some(i), n) => return Err(format!("--index {i}: the pipeline has {n} map stage(s)")),
            (None, 1) => 0,
            (None, 0) => return Err("the pipeline has no map stage to replace".into()),
            (None, n) => {
                return Err(format!(
                    "the pipeline has {n} map stages: say which with --index"
                ));
            }
        };
        Some(i)
    } else {
        None
    };
    if want_sink && !refs.iter().any(|r| r.stage == StageKind::Sink) {
        return Err("the pipeline has no sink stage to replace".into());
    }
    Ok((map_index, want_sink))
}

/// `refs` with the stages [`swap_targets`] chose now run by `digest`.
pub fn swapped_refs(
    refs: &[PluginRef],
    digest: &str,
    (map_index, want_sink): (Option<usize>, bool),
) -> Vec<PluginRef> {
    let mut out = refs.to_vec();
    if let Some(i) = map_index
        && let Some(r) = out.iter_mut().filter(|r| r.stage == StageKind::Map).nth(i)
    {
        r.digest = digest.to_string();
    }
    if want_sink {
        for r in out.iter_mut().filter(|r| r.stage == StageKind::Sink) {
            r.digest = digest.to_string();
        }
    }
    out
}

/// Replace stage(s) with a validated plugin (at a batch boundary); a
/// sink stage on every connection in `grants`.
pub(super) fn install_swap(
    stages: &mut Stages,
    cp: &dyn Checkpoint,
    grants: &[SqlGrant],
    plugin: Plugin,
    bytes: &[u8],
    stage: Option<StageKind>,
    index: Option<usize>,
) -> Result<(), String> {
    let (map_index, want_sink) = swap_targets(
        &stages.refs,
        (plugin.path(), plugin.digest()),
        plugin.stages(),
        stage,
        index,
    )?;
    if let Some(k) = stages
        .kafka
        .as_ref()
        .filter(|_| want_sink && !plugin.sends_records())
    {
        return Err(cannot_send(plugin.path(), plugin.digest(), k));
    }
    cp.store_plugin(bytes).map_err(|e| e.to_string())?;
    stages.files.insert(
        plugin.digest().to_string(),
        plugin.path().display().to_string(),
    );
    stages.refs = swapped_refs(&stages.refs, plugin.digest(), (map_index, want_sink));
    if let Some(i) = map_index {
        for slot in stages.maps.iter_mut().filter_map(|chain| chain.get_mut(i)) {
            *slot = plugin.instance();
        }
    }
    if want_sink {
        stages.sinks = sink_instances(&plugin, grants, stages.kafka.as_ref());
    }
    Ok(())
}
