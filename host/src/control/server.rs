//! The control socket server of a running owner: accepts connections on
//! `control.sock` (mode 0600) and serves each on its own thread. Requests
//! that change the pipeline are handed to the engine as [`Request`]s, which
//! it acts on only at a batch boundary; the server never touches the
//! checkpoint.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::channel;
use std::thread::JoinHandle;
use std::time::Duration;

use rustix::event::{PollFd, PollFlags};

use super::protocol::{Answer, Command, StatusAnswer, SwapAnswer, answer, refusal};
use super::{Request, SOCKET, ServerContext, SwapRequest, handover};

/// The socket server of a running owner. Dropping it stops the thread and
/// removes the socket file.
pub struct ControlServer {
    path: PathBuf,
    shutdown: Arc<AtomicBool>,
    waker: UnixStream,
    thread: Option<JoinHandle<()>>,
    unlinked: bool,
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

fn serve(stream: UnixStream, ctx: &ServerContext) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Ok(());
    }
    let command: Command = match serde_json::from_str(&line) {
        Ok(c) => c,
        Err(e) => {
            return answer(
                &mut writer,
                &refusal(format!("bad request {}: {e}", line.trim())),
            );
        }
    };
    match command {
        Command::Status => {
            let status = ctx.status.lock().map(|s| s.clone()).unwrap_or_default();
            answer(&mut writer, &Answer::ok(StatusAnswer { status }))
        }
        Command::Handover => handover::serve(&mut reader, &mut writer, ctx),
        Command::Swap { path, stage, index } => {
            let bytes = match std::fs::read(&path) {
                Ok(b) => b,
                Err(e) => {
                    return answer(
                        &mut writer,
                        &refusal(format!("plugin {}: cannot read: {e}", path.display())),
                    );
                }
            };
            // Compile and validate here, off the batch path.
            let plugin = match ctx.runtime.load_bytes(&path, &bytes, ctx.config.clone()) {
                Ok(p) => p,
                Err(e) => return answer(&mut writer, &refusal(e)),
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
                return answer(&mut writer, &refusal("the engine is stopping"));
            }
            ctx.wake.store(true, Ordering::Relaxed);
            match rx.recv() {
                Ok(Ok(effective_batch)) => answer(
                    &mut writer,
                    &Answer::ok(SwapAnswer {
                        digest,
                        effective_batch,
                    }),
                ),
                Ok(Err(e)) => answer(&mut writer, &refusal(e)),
                Err(_) => answer(
                    &mut writer,
                    &refusal("the engine stopped before installing the plugin"),
                ),
            }
        }
        Command::Go | Command::TookOver { .. } => answer(
            &mut writer,
            &refusal(format!("`{}` is only valid during a handover", line.trim())),
        ),
    }
}
