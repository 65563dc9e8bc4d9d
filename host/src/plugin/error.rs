//! Everything that can go wrong with a plugin, as one enum. Each variant
//! names the plugin file (and its digest once known) so a user can tell
//! which of several plugins failed, and what to do about it.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use super::CONTRACT_VERSION;

/// Which sandbox limit or fault stopped a guest call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrapKind {
    /// The per-call deadline (epoch interruption) expired.
    Timeout {
        /// The configured deadline.
        limit: Duration,
    },
    /// The guest asked WASI to wait (sleep, or a timer it polls) past the
    /// call's deadline; refused when asked, since a host call cannot be
    /// interrupted.
    WaitPastDeadline {
        /// The configured deadline.
        limit: Duration,
        /// The wait asked for.
        asked: Duration,
        /// What was left of the deadline when it was asked for.
        left: Duration,
    },
    /// The guest tried to grow its memory past the cap.
    OutOfMemory {
        /// The cap, bytes.
        limit: u64,
        /// The size the guest asked for, bytes.
        requested: u64,
    },
    /// The guest panicked; `message` is the panic text it printed.
    Panic {
        /// The panic message, from the guest's stderr.
        message: String,
    },
    /// The guest overflowed its call stack.
    StackOverflow,
    /// Any other trap (out-of-bounds access, `unreachable`, …).
    Other(String),
}

impl fmt::Display for TrapKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TrapKind::Timeout { limit } => write!(
                f,
                "deadline of {} ms exceeded (raise it with --plugin-timeout)",
                limit.as_millis()
            ),
            TrapKind::WaitPastDeadline { limit, asked, left } => write!(
                f,
                "a WASI sleep of {} ms would pass the call's deadline of {} ms ({} ms were left; sleep less, or raise the deadline with --plugin-timeout)",
                asked.as_millis(),
                limit.as_millis(),
                left.as_millis()
            ),
            TrapKind::OutOfMemory { limit, requested } => write!(
                f,
                "memory cap of {limit} bytes exceeded (asked for {requested} bytes; raise it with --plugin-memory)"
            ),
            TrapKind::Panic { message } => write!(f, "guest panicked: {message}"),
            TrapKind::StackOverflow => f.write_str("stack overflow"),
            TrapKind::Other(m) => write!(f, "trap: {m}"),
        }
    }
}

/// A stage's own error (the WIT `stage-error`), returned without a trap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StageFailure {
    /// Record `index` of the call is bad.
    BadRecord {
        /// Index in the call's batch.
        index: u32,
        /// Why.
        message: String,
    },
    /// Transient: retry the call.
    Retryable(String),
    /// The stage gave up.
    Fatal(String),
}

impl fmt::Display for StageFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StageFailure::BadRecord { index, message } => {
                write!(f, "bad record at index {index}: {message}")
            }
            StageFailure::Retryable(m) => write!(f, "retryable error: {m}"),
            StageFailure::Fatal(m) => write!(f, "fatal error: {m}"),
        }
    }
}

/// A guest call that trapped: which plugin, where, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trapped {
    /// The plugin file.
    pub path: PathBuf,
    /// Digest.
    pub digest: String,
    /// The export called (`map`, `sink.write`, …).
    pub call: &'static str,
    /// The input: topic, partition, offsets.
    pub site: String,
    /// The limit or fault.
    pub kind: TrapKind,
    /// The last lines the guest wrote to stderr.
    pub guest_stderr: String,
}

impl fmt::Display for Trapped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "plugin {} (sha256:{}) trapped in {} on {}: {}{}",
            self.path.display(),
            self.digest,
            self.call,
            self.site,
            self.kind,
            stderr_tail(&self.kind, &self.guest_stderr)
        )
    }
}

/// Errors from loading, instantiating or calling a plugin.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// The file could not be read.
    #[error("plugin {path}: cannot read it")]
    Read {
        /// The plugin file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is not WebAssembly at all.
    #[error(
        "plugin {path}: not a WebAssembly file (it starts with {head}); pass the .wasm built for wasm32-wasip2"
    )]
    NotWasm {
        /// The plugin file.
        path: PathBuf,
        /// The first bytes, escaped.
        head: String,
    },
    /// A core module, not a component.
    #[error(
        "plugin {path}: is a core WebAssembly module, not a component; build the plugin with `cargo build --target wasm32-wasip2` (which emits a component)"
    )]
    CoreModule {
        /// The plugin file.
        path: PathBuf,
    },
    /// Wasmtime refused the component.
    #[error("plugin {path}: invalid component: {reason}")]
    Invalid {
        /// The plugin file.
        path: PathBuf,
        /// Wasmtime's message.
        reason: String,
    },
    /// The component exports neither `mapper` nor `sink`.
    #[error(
        "plugin {path}: exports no Sluice stage (expected sluice:plugin/mapper@{CONTRACT_VERSION} or sluice:plugin/sink@{CONTRACT_VERSION}); it exports: {exports}"
    )]
    NoStage {
        /// The plugin file.
        path: PathBuf,
        /// What it exports instead.
        exports: String,
    },
    /// Built against another contract version.
    #[error(
        "plugin {path}: built for contract sluice:plugin@{found}, but this host implements sluice:plugin@{CONTRACT_VERSION}; rebuild the plugin against sluice-guest {CONTRACT_VERSION}"
    )]
    IncompatibleContract {
        /// The plugin file.
        path: PathBuf,
        /// The version it was built for.
        found: String,
    },
    /// A stage the pipeline needs is not exported.
    #[error("plugin {path} (sha256:{digest}): does not export a {stage} stage")]
    MissingStage {
        /// The plugin file.
        path: PathBuf,
        /// Digest.
        digest: String,
        /// `map` or `sink`.
        stage: &'static str,
    },
    /// Linking or instantiating failed (an import the sandbox does not
    /// grant, a start function that traps, …).
    #[error("plugin {path} (sha256:{digest}): cannot instantiate: {reason}")]
    Instantiate {
        /// The plugin file.
        path: PathBuf,
        /// Digest.
        digest: String,
        /// Why.
        reason: String,
    },
    /// The guest trapped; the instance was discarded.
    #[error("{0}")]
    Trap(Box<Trapped>),
    /// The stage returned an error (no trap).
    #[error("plugin {path} (sha256:{digest}) failed in {call} on {site}: {failure}")]
    Stage {
        /// The plugin file.
        path: PathBuf,
        /// Digest.
        digest: String,
        /// The export called.
        call: &'static str,
        /// The input: topic, partition, offsets.
        site: String,
        /// The stage's error.
        failure: StageFailure,
    },
    /// A map call produced more outputs than the host holds for one call
    /// (host memory grows with every output, beyond the plugin's cap).
    #[error(
        "plugin {path} (sha256:{digest}) produced {outputs} outputs from one map call on {site}, more than the limit of {limit} per call: a stage that fans out this much is most likely broken; the batch is not committed"
    )]
    TooManyOutputs {
        /// The plugin file.
        path: PathBuf,
        /// Digest.
        digest: String,
        /// The input.
        site: String,
        /// How many it produced.
        outputs: usize,
        /// [`super::MAX_OUTPUTS_PER_CALL`].
        limit: usize,
    },
    /// The guest returned a batch the host cannot decode.
    #[error(
        "plugin {path} (sha256:{digest}) returned a malformed result from {call} on {site}: {reason}"
    )]
    BadResult {
        /// The plugin file.
        path: PathBuf,
        /// Digest.
        digest: String,
        /// The export called.
        call: &'static str,
        /// The input.
        site: String,
        /// What is wrong.
        reason: String,
    },
}

/// The guest's stderr on one line, unless the kind already carries it (a
/// panic message is extracted from stderr).
fn stderr_tail(kind: &TrapKind, s: &str) -> String {
    if matches!(kind, TrapKind::Panic { .. }) {
        return String::new();
    }
    let lines: Vec<&str> = s.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    if lines.is_empty() {
        String::new()
    } else {
        format!("; guest stderr: {}", lines.join(" | "))
    }
}

impl PluginError {
    /// True when the call may succeed if retried (a retryable stage error
    /// or a trap other than a deterministic contract violation).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            PluginError::Trap(_)
                | PluginError::Stage {
                    failure: StageFailure::Retryable(_),
                    ..
                }
        )
    }
}

/// The trap of a call that asked WASI to wait past the call's deadline
/// (a sleep, or a timer it polls): the epoch deadline cannot interrupt a
/// host call, so the wait is refused when it is asked for, not served.
#[derive(Debug)]
pub(crate) struct WaitPastDeadline {
    /// The wait asked for.
    pub(crate) asked: Duration,
    /// What was left of the call's deadline.
    pub(crate) left: Duration,
}

impl std::fmt::Display for WaitPastDeadline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "a WASI sleep of {} ms would pass the call's deadline ({} ms left)",
            self.asked.as_millis(),
            self.left.as_millis()
        )
    }
}

impl std::error::Error for WaitPastDeadline {}
