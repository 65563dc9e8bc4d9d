//! The wasmtime side of Sluice: load plugin components, check them against
//! the contract (`wit/plugin.wit`, `sluice:plugin@0.2.3`), and run their
//! stages in a sandbox.
//!
//! Invariants:
//! - A [`Plugin`] is compiled and linked once (`InstancePre`); every
//!   [`Instance`] is a fresh store made from that template, with a memory
//!   cap and a per-call epoch deadline. A trap discards the instance; the
//!   next call builds a new one. The host process never dies of a guest.
//! - The sandbox grants no preopened directory, no environment variable,
//!   no socket and no name lookup; only `log`, `config` and WASI's clocks
//!   and random. Guest stdout/stderr are captured and sent to the host log.
//! - Binding types never leave this module: callers see [`crate::wire`]
//!   records, [`MapResult`] and [`PluginError`].

mod bindings;
pub mod chain;
mod contract;
mod error;
mod guest_stderr;
mod imports;
mod instance;
mod limiter;
mod log_budget;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::component::{Component, Linker};
use wasmtime::{Config, Engine};

pub use contract::{BadRecord, CallContext, MapResult, OpenAnswer, PartitionContext};
pub use error::{PluginError, StageFailure, TrapKind, Trapped};
pub use instance::{Instance, describe_site};

/// The contract version this host implements (`sluice:plugin@<this>`).
pub const CONTRACT_VERSION: &str = sluice_guest::CONTRACT_VERSION;

/// Interval between epoch ticks. Deadlines are rounded up to it.
const EPOCH_TICK: Duration = Duration::from_millis(5);

/// Most outputs one map call may return (the host keeps each in memory,
/// outside the plugin's memory cap): 500 per record of a full piece of
/// 2,000.
pub const MAX_OUTPUTS_PER_CALL: usize = 1_000_000;

/// Most log lines (`log` calls and stdout/stderr lines together) a plugin
/// instance writes into the host's log per call; the rest are counted and
/// reported in one line.
pub const LOG_LINES_PER_CALL: u32 = 200;

/// Most log lines a plugin instance writes into the host's log per second,
/// over all its calls (many short calls would each get
/// [`LOG_LINES_PER_CALL`]).
pub const LOG_LINES_PER_SECOND: u32 = 1000;

/// Longest plugin log line kept, bytes; longer ones are cut.
pub const LOG_LINE_BYTES: usize = 4096;

/// Sandbox limits applied to every instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Wall-clock budget of one guest call (`map`, `sink.write`, …).
    /// Default 10 s: generous for a 10,000-record batch, short enough that
    /// a runaway loop is noticed.
    pub call_timeout: Duration,
    /// Cap on each instance's linear memory, bytes. Default 256 MiB.
    pub memory_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            call_timeout: Duration::from_secs(10),
            memory_bytes: 256 << 20,
        }
    }
}

/// The stages a component exports (`plugin inspect` shows them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Exports {
    /// Exports `sluice:plugin/mapper`.
    pub map: bool,
    /// Exports `sluice:plugin/sink`.
    pub sink: bool,
}

impl Exports {
    /// `["map", "sink"]`-style names of the exported stages.
    pub fn names(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        if self.map {
            v.push("map");
        }
        if self.sink {
            v.push("sink");
        }
        v
    }
}

/// A component's identity: the lower-case hex sha256 of its bytes (its
/// name in a checkpoint's `plugins/`, in progress output and status).
pub fn digest(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Whether Cranelift inlines calls within a component:
/// `SLUICE_PLUGIN_INLINING=on`; off by default (wasmtime's default too).
///
/// The guest's JSON code is many small functions, and with inlining the
/// company map ran 1.3x faster (bench/plugin.sh; docs/benchmarks.md
/// "Session 13"). The price is paid when a component is compiled (once;
/// then the compile cache answers), and its memory is why it is not the
/// default: release host, `host plugin inspect` without the cache, the
/// release company.wasm took 0.33 -> 1.7 s and peak RSS 30 -> 323 MiB, a
/// debug build of cdc.wasm 0.9 -> 10 s and 1.6 GiB. A pipeline in a
/// container with a memory limit would be killed at its first start.
fn inlining() -> bool {
    match std::env::var("SLUICE_PLUGIN_INLINING").as_deref() {
        Err(_) | Ok("off") => false,
        Ok("on") => true,
        Ok(other) => {
            tracing::warn!("SLUICE_PLUGIN_INLINING={other} is neither on nor off: off");
            false
        }
    }
}

/// The engine shared by every plugin, with its epoch ticker thread.
pub struct Runtime {
    engine: Engine,
    linker: Linker<instance::State>,
    limits: Limits,
    ticker: Option<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
}

impl Runtime {
    /// Build the engine (Cranelift, epoch interruption, component model,
    /// inlining as [`inlining`] says) and the sandboxed linker.
    ///
    /// # Errors
    /// When wasmtime cannot be configured on this machine.
    pub fn new(limits: Limits) -> Result<Self, String> {
        let mut config = Config::new();
        config.wasm_component_model(true);
        config.epoch_interruption(true);
        if inlining() {
            config.compiler_inlining(wasmtime::Inlining::Yes);
        }
        #[cfg(feature = "profiling")]
        if std::env::var_os("SLUICE_PERF_MAP").is_some() {
            config.profiler(wasmtime::ProfilingStrategy::PerfMap);
        }
        // Compiled code is cached on disk (keyed by the component's bytes),
        // so restarts and `host test` do not recompile unchanged plugins.
        if std::env::var_os("SLUICE_NO_COMPILE_CACHE").is_none() {
            match wasmtime::Cache::from_file(None) {
                Ok(cache) => {
                    config.cache(Some(cache));
                }
                Err(e) => tracing::debug!("wasmtime compile cache unavailable: {e}"),
            }
        }
        let engine = Engine::new(&config).map_err(|e| format!("wasmtime engine: {e}"))?;
        let linker = imports::linker(&engine).map_err(|e| format!("wasmtime linker: {e}"))?;

        let stop = Arc::new(AtomicBool::new(false));
        let ticker = {
            let engine = engine.clone();
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("sluice-epoch".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(EPOCH_TICK);
                        engine.increment_epoch();
                    }
                })
                .map_err(|e| format!("epoch thread: {e}"))?
        };
        Ok(Runtime {
            engine,
            linker,
            limits,
            ticker: Some(ticker),
            stop,
        })
    }

    /// The limits applied to new instances.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Read, validate, compile and pre-link the component at `path`.
    ///
    /// # Errors
    /// [`PluginError::Read`], [`PluginError::NotWasm`],
    /// [`PluginError::CoreModule`], [`PluginError::Invalid`],
    /// [`PluginError::NoStage`], [`PluginError::IncompatibleContract`] or
    /// [`PluginError::Instantiate`] (an import the sandbox does not grant).
    pub fn load(
        &self,
        path: &Path,
        config: Arc<BTreeMap<String, String>>,
    ) -> Result<Plugin, PluginError> {
        let bytes = std::fs::read(path).map_err(|source| PluginError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        self.load_bytes(path, &bytes, config)
    }

    /// As [`Runtime::load`], from bytes already read (`path` is only used
    /// in messages).
    ///
    /// # Errors
    /// As [`Runtime::load`].
    pub fn load_bytes(
        &self,
        path: &Path,
        bytes: &[u8],
        config: Arc<BTreeMap<String, String>>,
    ) -> Result<Plugin, PluginError> {
        let path = path.to_path_buf();
        check_header(&path, bytes)?;
        let digest = digest(bytes);
        let component = Component::new(&self.engine, bytes).map_err(|e| PluginError::Invalid {
            path: path.clone(),
            reason: format!("{e:#}"),
        })?;
        let info = describe(&self.engine, &component);
        let stages = contract_stages(&path, &info)?;
        let pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(|e| PluginError::Instantiate {
                path: path.clone(),
                digest: digest.clone(),
                reason: format!("{e:#} (the sandbox grants only sluice:plugin/log, config, sql and kafka, and WASI clocks, random and stdio)"),
            })?;
        let sends = info
            .imports
            .iter()
            .any(|i| sluice_interface(i).is_some_and(|(iface, _)| iface == "kafka"));
        let template = instance::Template::new(pre, stages, &path, &digest, sends)?;
        let plugin = Plugin {
            path,
            digest,
            size: bytes.len() as u64,
            stages,
            imports: info.imports,
            exports: info.exports,
            template: Arc::new(template),
            config,
            limits: self.limits,
            engine: self.engine.clone(),
        };
        // Instantiate once now, so a plugin that traps at instantiation is
        // refused at load (or swap) time rather than in the first batch.
        plugin.instance().ensure_live()?;
        Ok(plugin)
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.ticker.take() {
            let _ = t.join();
        }
    }
}

/// A loaded, validated plugin: the pre-instantiated template plus facts
/// for `host plugin inspect`.
#[derive(Clone)]
pub struct Plugin {
    path: PathBuf,
    digest: String,
    size: u64,
    stages: Exports,
    imports: Vec<String>,
    exports: Vec<String>,
    template: Arc<instance::Template>,
    config: Arc<BTreeMap<String, String>>,
    limits: Limits,
    engine: Engine,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("path", &self.path)
            .field("digest", &self.digest)
            .field("stages", &self.stages)
            .finish_non_exhaustive()
    }
}

impl Plugin {
    /// The file it was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Lower-case hex sha256 of the component bytes.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// Size of the component, bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Exported stages.
    pub fn stages(&self) -> Exports {
        self.stages
    }

    /// Whether the component imports `sluice:plugin/kafka` (contract
    /// 0.2.4): its sink may send records to the output topics.
    pub fn sends_records(&self) -> bool {
        self.template.sends()
    }

    /// Names of everything the component imports (interfaces).
    pub fn imports(&self) -> &[String] {
        &self.imports
    }

    /// Names of everything the component exports (interfaces).
    pub fn exports(&self) -> &[String] {
        &self.exports
    }

    /// A new sandboxed instance (lazily instantiated on first call), with
    /// no capability beyond `log` and `config`.
    pub fn instance(&self) -> Instance {
        self.instance_with_sql(None)
    }

    /// A new sandboxed instance granted the SQL capability (sink stages).
    pub fn instance_with_sql(&self, sql: Option<crate::capability::sql::SqlGrant>) -> Instance {
        Instance::new(
            self.engine.clone(),
            self.template.clone(),
            self.config.clone(),
            self.limits,
            sql,
        )
    }
}

/// First bytes of a file: `\0asm` then version/layer. Core modules are
/// version 1 layer 0; components are version 0x0d layer 1.
fn check_header(path: &Path, bytes: &[u8]) -> Result<(), PluginError> {
    if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
        let head: String = bytes
            .iter()
            .take(8)
            .flat_map(|b| std::ascii::escape_default(*b))
            .map(char::from)
            .collect();
        return Err(PluginError::NotWasm {
            path: path.to_path_buf(),
            head: format!("\"{head}\""),
        });
    }
    if bytes[6..8] == [0, 0] {
        return Err(PluginError::CoreModule {
            path: path.to_path_buf(),
        });
    }
    Ok(())
}

struct ComponentInfo {
    imports: Vec<String>,
    exports: Vec<String>,
}

fn describe(engine: &Engine, component: &Component) -> ComponentInfo {
    let ty = component.component_type();
    ComponentInfo {
        imports: ty.imports(engine).map(|(n, _)| n.to_string()).collect(),
        exports: ty.exports(engine).map(|(n, _)| n.to_string()).collect(),
    }
}

/// Split `sluice:plugin/mapper@0.2.3` into (`mapper`, `0.2.3`).
fn sluice_interface(name: &str) -> Option<(&str, &str)> {
    let rest = name.strip_prefix("sluice:plugin/")?;
    let (iface, version) = rest.split_once('@').unwrap_or((rest, ""));
    Some((iface, version))
}

/// Semver compatibility of a contract version with ours: same major, and
/// same minor while the major is 0.
pub fn contract_compatible(version: &str) -> bool {
    let parse = |v: &str| -> Option<(u64, u64)> {
        let mut it = v.split(['.', '-', '+']);
        Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
    };
    match (parse(version), parse(CONTRACT_VERSION)) {
        (Some((ma, mi)), Some((oma, omi))) => ma == oma && (ma != 0 || mi == omi),
        _ => false,
    }
}

fn contract_stages(path: &Path, info: &ComponentInfo) -> Result<Exports, PluginError> {
    let mut stages = Exports::default();
    let mut incompatible = None;
    for name in &info.exports {
        let Some((iface, version)) = sluice_interface(name) else {
            continue;
        };
        if !contract_compatible(version) {
            incompatible = Some(
                if version.is_empty() {
                    "(unversioned)"
                } else {
                    version
                }
                .to_string(),
            );
            continue;
        }
        match iface {
            "mapper" => stages.map = true,
            "sink" => stages.sink = true,
            _ => {}
        }
    }
    if !stages.map && !stages.sink {
        if let Some(found) = incompatible {
            return Err(PluginError::IncompatibleContract {
                path: path.to_path_buf(),
                found,
            });
        }
        return Err(PluginError::NoStage {
            path: path.to_path_buf(),
            exports: if info.exports.is_empty() {
                "nothing".into()
            } else {
                info.exports.join(", ")
            },
        });
    }
    Ok(stages)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contract_versions() {
        assert!(contract_compatible("0.2.0"));
        assert!(contract_compatible("0.2.7"));
        // 0.1 sinks were opened once per partition and batch; 0.2 opens
        // each part of a range.
        assert!(!contract_compatible("0.1.0"));
        assert!(!contract_compatible("0.3.0"));
        assert!(!contract_compatible("9.0.0"));
        assert!(!contract_compatible(""));
    }

    #[test]
    fn headers() {
        let p = Path::new("x.wasm");
        assert!(matches!(
            check_header(p, b"hello world"),
            Err(PluginError::NotWasm { .. })
        ));
        assert!(matches!(
            check_header(p, b"\0asm\x01\0\0\0"),
            Err(PluginError::CoreModule { .. })
        ));
        assert!(check_header(p, b"\0asm\x0d\0\x01\0").is_ok());
    }
}
