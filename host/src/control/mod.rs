//! The owner's control socket (`control.sock` in the checkpoint directory,
//! mode 0600): status, handover to a `--takeover` process, and plugin swap.
//!
//! Protocol: one JSON object per line each way. Requests:
//! `{"op":"status"}`, `{"op":"handover"}`, `{"op":"swap","path":…,
//! "stage":"map"|"sink"|null,"index":N}`; after a handover reply the new
//! owner may send `{"op":"took-over","first_write_ahead_ms":T,"epoch":E}`
//! so the old owner can log the gap. Answers carry `"ok": true|false`.
//!
//! Invariants: the socket thread never touches the checkpoint; it hands
//! requests to the engine, which acts on them only at a batch boundary
//! (after a commit, before the next plan). A swap is compiled and validated
//! here, off the batch path.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rustix::event::{PollFd, PollFlags};
use serde::Serialize;
use serde_json::{Value, json};

use crate::checkpoint::{PluginRef, StageKind};
use crate::plugin::{Plugin, Runtime};
use crate::util::now_ms;

/// File name of the socket inside the checkpoint directory.
pub const SOCKET: &str = "control.sock";

/// What the owner publishes about itself (answer to `status`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct LiveStatus {
    /// Owner process id.
    pub pid: u32,
    /// Owner host.
    pub hostname: String,
    /// Owner epoch.
    pub epoch: u64,
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
#[derive(Debug, Clone, Serialize)]
pub struct HandoverNote {
    /// The old owner's epoch.
    pub epoch: u64,
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

/// Requests for the engine.
pub enum Request {
    /// Finish, commit, offer the checkpoint; release on confirmation.
    Handover(Handover),
    /// Install a plugin at the next batch boundary.
    Swap(Box<SwapRequest>),
}

/// The socket server of a running owner. Dropping it stops the thread and
/// removes the socket file.
pub struct ControlServer {
    path: PathBuf,
    shutdown: Arc<AtomicBool>,
    waker: UnixStream,
    thread: Option<JoinHandle<()>>,
    unlinked: bool,
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

impl ControlServer {
    /// Bind `dir/control.sock` (replacing a stale one: only the lock holder
    /// calls this) and serve requests until dropped.
    ///
    /// # Errors
    /// The OS error from bind or chmod.
    pub fn start(dir: &Path, ctx: ServerContext) -> std::io::Result<Self> {
        // The thread sleeps in poll(2) on the listener and on one end of a
        // socket pair; dropping the server shuts the other end down, so
        // both requests and shutdown are served at once (no polling
        // interval). Made first: a failure here leaves no socket file.
        let (waker, wake_rx) = UnixStream::pair()?;
        let path = dir.join(SOCKET);
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        listener.set_nonblocking(true)?;
        let shutdown = Arc::new(AtomicBool::new(false));
        let stop = shutdown.clone();
        let thread = std::thread::Builder::new()
            .name("sluice-control".into())
            .spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            // One thread per connection: a handover waiting
                            // for a batch boundary must not block `status`.
                            let ctx = ctx.clone();
                            let _ = std::thread::Builder::new()
                                .name("sluice-control-conn".into())
                                .spawn(move || {
                                    if let Err(e) = serve(stream, &ctx) {
                                        tracing::debug!("control connection: {e}");
                                    }
                                });
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            let mut fds = [
                                PollFd::new(&listener, PollFlags::IN),
                                PollFd::new(&wake_rx, PollFlags::IN),
                            ];
                            if let Err(e) = rustix::event::poll(&mut fds, None)
                                && e != rustix::io::Errno::INTR
                            {
                                tracing::warn!("control socket poll: {e}");
                                std::thread::sleep(Duration::from_millis(200));
                            }
                        }
                        Err(e) => {
                            tracing::warn!("control socket: {e}");
                            std::thread::sleep(Duration::from_millis(200));
                        }
                    }
                }
            })?;
        Ok(ControlServer {
            path,
            shutdown,
            waker,
            thread: Some(thread),
            unlinked: false,
        })
    }

    /// Remove the socket file now (before releasing the lock at handover,
    /// so the next owner's socket is never removed by us). Connections in
    /// progress continue.
    pub fn unlink(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        self.unlinked = true;
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.shutdown.store(true, Ordering::Release);
        // Wake the thread from poll(2): its end of the pair becomes readable
        // (end of stream). Unlike a write, this cannot raise SIGPIPE if the
        // thread is already gone.
        let _ = self.waker.shutdown(std::net::Shutdown::Both);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if !self.unlinked {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn answer(stream: &mut UnixStream, v: &Value) -> std::io::Result<()> {
    let mut line = v.to_string();
    line.push('\n');
    stream.write_all(line.as_bytes())?;
    stream.flush()
}

fn fail(e: impl std::fmt::Display) -> Value {
    json!({"ok": false, "error": e.to_string()})
}

fn serve(stream: UnixStream, ctx: &ServerContext) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Ok(());
    }
    let req: Value = match serde_json::from_str(&line) {
        Ok(v) => v,
        Err(e) => return answer(&mut writer, &fail(format!("bad request: {e}"))),
    };
    match req["op"].as_str() {
        Some("status") => {
            let s = ctx.status.lock().map(|s| s.clone()).unwrap_or_default();
            answer(&mut writer, &json!({"ok": true, "status": s}))
        }
        Some("handover") => {
            let (note_tx, note_rx) = channel();
            let (go_tx, go_rx) = channel();
            // Dropped at the end of this conversation, which wakes the engine.
            let (_finished_tx, finished_rx) = channel::<()>();
            if ctx
                .requests
                .send(Request::Handover(Handover {
                    note: note_tx,
                    go: go_rx,
                    finished: finished_rx,
                }))
                .is_err()
            {
                return answer(&mut writer, &fail("the engine is stopping"));
            }
            ctx.wake.store(true, Ordering::Relaxed);
            let note = match note_rx.recv() {
                Ok(n) => n,
                Err(_) => {
                    return answer(&mut writer, &fail("the engine stopped before handing over"));
                }
            };
            // Phase 1: offer. Phase 2: release only if the requester is still
            // there and confirms.
            let mut go = answer(
                &mut writer,
                &json!({"ok": true, "phase": "ready", "note": note}),
            )
            .is_ok();
            if go {
                reader
                    .get_ref()
                    .set_read_timeout(Some(Duration::from_secs(10)))?;
                line.clear();
                go = reader.read_line(&mut line).is_ok()
                    && serde_json::from_str::<Value>(&line).is_ok_and(|v| v["op"] == "go");
            }
            let _ = go_tx.send(go);
            if !go {
                return Ok(());
            }
            // Wait (bounded) for the new owner's first write-ahead time.
            reader
                .get_ref()
                .set_read_timeout(Some(Duration::from_secs(60)))?;
            line.clear();
            if reader.read_line(&mut line).is_ok()
                && let Ok(v) = serde_json::from_str::<Value>(&line)
                && let Some(t) = v["first_write_ahead_ms"].as_i64()
            {
                let from = note.last_commit_ms.unwrap_or(note.released_at_ms);
                tracing::info!(
                    new_epoch = v["epoch"].as_u64().unwrap_or_default(),
                    "handover complete: gap from our last commit to the new owner's first write-ahead: {} ms",
                    t - from
                );
            }
            Ok(())
        }
        Some("swap") => {
            let Some(path) = req["path"].as_str() else {
                return answer(&mut writer, &fail("swap needs a path"));
            };
            let stage = match req["stage"].as_str() {
                None => None,
                Some("map") => Some(StageKind::Map),
                Some("sink") => Some(StageKind::Sink),
                Some(other) => {
                    return answer(&mut writer, &fail(format!("unknown stage `{other}`")));
                }
            };
            let index = req["index"].as_u64().map(|i| i as usize);
            let path = PathBuf::from(path);
            let bytes = match std::fs::read(&path) {
                Ok(b) => b,
                Err(e) => {
                    return answer(
                        &mut writer,
                        &fail(format!("plugin {}: cannot read: {e}", path.display())),
                    );
                }
            };
            // Compile and validate here, off the batch path.
            let plugin = match ctx.runtime.load_bytes(&path, &bytes, ctx.config.clone()) {
                Ok(p) => p,
                Err(e) => return answer(&mut writer, &fail(e)),
            };
            let digest = plugin.digest().to_string();
            let (tx, rx) = channel();
            let sent = ctx.requests.send(Request::Swap(Box::new(SwapRequest {
                plugin,
                bytes,
                stage,
                index,
                reply: tx,
            })));
            if sent.is_err() {
                return answer(&mut writer, &fail("the engine is stopping"));
            }
            ctx.wake.store(true, Ordering::Relaxed);
            match rx.recv() {
                Ok(Ok(batch)) => answer(
                    &mut writer,
                    &json!({"ok": true, "digest": digest, "effective_batch": batch}),
                ),
                Ok(Err(e)) => answer(&mut writer, &fail(e)),
                Err(_) => answer(
                    &mut writer,
                    &fail("the engine stopped before installing the plugin"),
                ),
            }
        }
        _ => answer(&mut writer, &fail(format!("unknown op in {}", line.trim()))),
    }
}

/// Errors of a control client.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nobody listens: no owner is running.
    #[error("no running owner answers on {}: {source}", .path.display())]
    NotRunning {
        /// The socket path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The owner did not answer in time.
    #[error("the owner did not answer on {} within {} s", .path.display(), .timeout.as_secs())]
    Timeout {
        /// The socket path.
        path: PathBuf,
        /// The wait.
        timeout: Duration,
    },
    /// The owner refused.
    #[error("{0}")]
    Refused(String),
    /// I/O or protocol error.
    #[error("control socket {}: {detail}", .path.display())]
    Protocol {
        /// The socket path.
        path: PathBuf,
        /// What went wrong.
        detail: String,
    },
}

/// A connection to a running owner.
pub struct Client {
    path: PathBuf,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    timeout: Duration,
}

impl Client {
    /// Connect to the owner of checkpoint `dir`.
    ///
    /// # Errors
    /// [`ClientError::NotRunning`].
    pub fn connect(dir: &Path, timeout: Duration) -> Result<Self, ClientError> {
        let path = dir.join(SOCKET);
        let stream = UnixStream::connect(&path).map_err(|source| ClientError::NotRunning {
            path: path.clone(),
            source,
        })?;
        let proto = |e: std::io::Error| ClientError::Protocol {
            path: path.clone(),
            detail: e.to_string(),
        };
        stream.set_read_timeout(Some(timeout)).map_err(proto)?;
        let writer = stream.try_clone().map_err(proto)?;
        Ok(Client {
            path: path.clone(),
            reader: BufReader::new(stream),
            writer,
            timeout,
        })
    }

    /// Send one request line and read one answer line.
    ///
    /// # Errors
    /// [`ClientError::Timeout`], [`ClientError::Refused`] (an `ok: false`
    /// answer), [`ClientError::Protocol`].
    pub fn request(&mut self, req: &Value) -> Result<Value, ClientError> {
        self.send(req)?;
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) => Err(ClientError::Protocol {
                path: self.path.clone(),
                detail: "the owner closed the connection".into(),
            }),
            Ok(_) => {
                let v: Value = serde_json::from_str(&line).map_err(|e| ClientError::Protocol {
                    path: self.path.clone(),
                    detail: e.to_string(),
                })?;
                if v["ok"] == true {
                    Ok(v)
                } else {
                    Err(ClientError::Refused(
                        v["error"].as_str().unwrap_or("refused").to_string(),
                    ))
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Err(ClientError::Timeout {
                    path: self.path.clone(),
                    timeout: self.timeout,
                })
            }
            Err(e) => Err(ClientError::Protocol {
                path: self.path.clone(),
                detail: e.to_string(),
            }),
        }
    }

    /// Send one line without waiting for an answer.
    ///
    /// # Errors
    /// [`ClientError::Protocol`].
    pub fn send(&mut self, v: &Value) -> Result<(), ClientError> {
        let mut line = v.to_string();
        line.push('\n');
        self.writer
            .write_all(line.as_bytes())
            .and_then(|()| self.writer.flush())
            .map_err(|e| ClientError::Protocol {
                path: self.path.clone(),
                detail: e.to_string(),
            })
    }
}

/// The engine's side: drain queued requests.
pub fn pending(rx: &Receiver<Request>) -> Vec<Request> {
    rx.try_iter().collect()
}

/// Milliseconds since the Unix epoch (re-exported for callers).
pub fn now() -> i64 {
    now_ms()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::Limits;
    use std::time::Instant;

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
                let v = c.request(&json!({"op": "status"})).unwrap();
                assert_eq!(v["status"]["pid"], 42);
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
