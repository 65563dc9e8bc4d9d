//! The owner's control socket (`control.sock` in the checkpoint directory,
//! mode 0600): status, handover to a `--takeover` process, and plugin swap.
//!
//! Files: `protocol` is the wire format (typed commands and answers),
//! `server` the owner's socket thread, `client` the other end, `handover`
//! all three sides of a takeover; this one holds what the server hands to
//! the engine ([`Request`]) and what the owner publishes ([`LiveStatus`]).
//!
//! Invariants: the socket thread never touches the checkpoint; it hands
//! requests to the engine, which acts on them only at a batch boundary
//! (after a commit, before the next plan). A swap is compiled and validated
//! here, off the batch path.

mod client;
pub mod handover;
pub mod protocol;
mod server;

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::checkpoint::{Epoch, PluginRef, StageKind};
use crate::plugin::{Plugin, Runtime};

pub use client::{Client, ClientError};
pub use server::ControlServer;

/// File name of the socket inside the checkpoint directory (the
/// directory's layout is the checkpoint's).
pub const SOCKET: &str = crate::checkpoint::CONTROL_SOCKET;

/// What the owner publishes about itself (answer to `status`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct LiveStatus {
    /// Owner process id.
    pub pid: u32,
    /// Owner host.
    pub hostname: String,
    /// Owner epoch.
    pub epoch: Epoch,
    /// Start time, ms since the Unix epoch.
    pub since_ms: i64,
    /// Checkpoint query id.
    pub query_id: String,
    /// Batch being processed now, if any.
    pub current_batch: Option<u64>,
    /// Last committed batch.
    pub last_committed: Option<u64>,
    /// Plugins in use, in stage order.
    pub plugins: Vec<PluginRef>,
    /// The last progress event.
    pub last_progress: Option<Value>,
    /// Swaps applied by this process.
    pub swaps: u64,
    /// Where the outputs go (`--output-topic`): `topic on brokers
    /// (guarantee)`, and under exactly once the transactional id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
}

/// A validated plugin waiting to be installed.
pub struct SwapRequest {
    /// The loaded plugin.
    pub plugin: Plugin,
    /// Its bytes (for the checkpoint's plugin store).
    pub bytes: Vec<u8>,
    /// Which stage to replace (`None`: what the plugin exports).
    pub stage: Option<StageKind>,
    /// Which map stage (0-based), when replacing a map stage.
    pub index: Option<usize>,
    /// The engine's answer: the batch id where it takes effect.
    pub reply: Sender<Result<u64, String>>,
}

/// What the engine answers to a handover.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct HandoverNote {
    /// The old owner's epoch.
    pub epoch: Epoch,
    /// Last committed batch.
    pub last_batch: Option<u64>,
    /// When that batch committed, ms since the Unix epoch.
    pub last_commit_ms: Option<i64>,
    /// When the lock was released.
    pub released_at_ms: i64,
    /// Old owner pid.
    pub pid: u32,
}

/// A handover in two phases: the engine sends its note at a batch boundary
/// (still holding the lock) and releases only on `go = true`; anything else
/// (the requester gave up) leaves it running as the owner.
pub struct Handover {
    /// The engine's note, sent at the boundary.
    pub note: Sender<HandoverNote>,
    /// The requester's confirmation.
    pub go: Receiver<bool>,
    /// Closed when the conversation ended (the new owner reported its first
    /// write-ahead, or gave up): the old owner exits only then, so it can log
    /// the gap.
    pub finished: Receiver<()>,
}

/// Everything the server thread needs.
#[derive(Clone)]
pub struct ServerContext {
    /// Shared engine/linker (swap compiles here).
    pub runtime: Arc<Runtime>,
    /// Plugin configuration of the pipeline.
    pub config: Arc<BTreeMap<String, String>>,
    /// Published status.
    pub status: Arc<Mutex<LiveStatus>>,
    /// To the engine.
    pub requests: Sender<Request>,
    /// Set when a request is queued, so a sleeping engine wakes up.
    pub wake: Arc<AtomicBool>,
}

/// Requests for the engine.
pub enum Request {
    /// Finish, commit, offer the checkpoint; release on confirmation.
    Handover(Handover),
    /// Install a plugin at the next batch boundary.
    Swap(Box<SwapRequest>),
}

/// The engine's side: drain queued requests.
pub fn pending(rx: &Receiver<Request>) -> Vec<Request> {
    rx.try_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::protocol::{Command, StatusAnswer};
    use super::*;
    use crate::plugin::{Limits, Runtime};
    use std::collections::BTreeMap;
    use std::path::Path;
    use std::sync::atomic::AtomicBool;
    use std::sync::mpsc::channel;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    fn server(dir: &Path) -> (ControlServer, Receiver<Request>) {
        let (tx, rx) = channel();
        let ctx = ServerContext {
            runtime: Arc::new(Runtime::new(Limits::default()).unwrap()),
            config: Arc::new(BTreeMap::new()),
            status: Arc::new(Mutex::new(LiveStatus {
                pid: 42,
                ..LiveStatus::default()
            })),
            requests: tx,
            wake: Arc::new(AtomicBool::new(false)),
        };
        (ControlServer::start(dir, ctx).unwrap(), rx)
    }

    #[test]
    fn requests_are_answered_and_drop_returns_at_once() {
        for unlink_first in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let (mut srv, _rx) = server(dir.path());
            for _ in 0..3 {
                let mut c = Client::connect(dir.path(), Duration::from_secs(5)).unwrap();
                let started = Instant::now();
                let v: StatusAnswer = c.request(&Command::Status).unwrap();
                assert_eq!(v.status.pid, 42);
                // Served from poll(2), not from a polling interval.
                assert!(started.elapsed() < Duration::from_secs(2));
            }
            if unlink_first {
                srv.unlink();
                assert!(!dir.path().join(SOCKET).exists());
            }
            let started = Instant::now();
            drop(srv);
            assert!(
                started.elapsed() < Duration::from_secs(1),
                "drop took {:?}",
                started.elapsed()
            );
            assert!(!dir.path().join(SOCKET).exists());
        }
    }
}
