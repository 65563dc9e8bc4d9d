//! The one process watcher: a `host` child whose stderr lines are
//! collected as they arrive, so a test can wait for a log line, signal or
//! kill the process, and read its whole log. Dropping it kills the child
//! (a test that fails mid-way leaves no host behind, one paused at a
//! failpoint holding a database, say).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::host_bin;

/// A running `host` (stdout discarded, stderr collected, `RUST_LOG=info`,
/// no failpoint unless `env` sets one).
pub struct HostProcess {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    reader: Option<JoinHandle<()>>,
}

impl HostProcess {
    /// Start `host` with `args`, and `env` on top of this process's.
    pub fn spawn(args: &[String], env: &[(&str, &str)]) -> HostProcess {
        let mut cmd = Command::new(host_bin());
        cmd.args(args)
            .env("RUST_LOG", "info")
            .env_remove("SLUICE_FAILPOINT")
            .env_remove("SLUICE_FAILPOINT_RESUME_FILE")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn host");
        let err = child.stderr.take().expect("piped stderr");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        let reader = std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(l);
            }
        });
        HostProcess {
            child,
            lines,
            reader: Some(reader),
        }
    }

    /// [`HostProcess::spawn`] with no extra environment.
    pub fn start(args: &[String]) -> HostProcess {
        Self::spawn(args, &[])
    }

    /// Wait until a line containing `needle` was logged (at most
    /// `timeout`, then fail with the log); that line.
    pub fn wait_for(&mut self, needle: &str, timeout: Duration) -> String {
        match self.logged(needle, timeout) {
            Some(l) => l,
            None => panic!("`{needle}` not logged; log:\n{}", self.log()),
        }
    }

    /// The first line containing `needle`, waiting at most `timeout`;
    /// `None` when it was not logged by then or the process exited first.
    pub fn logged(&mut self, needle: &str, timeout: Duration) -> Option<String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(l) = self.find(needle) {
                return Some(l);
            }
            let exited = self.child.try_wait().ok().flatten().is_some();
            if exited {
                self.join_reader();
                return self.find(needle);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn find(&self, needle: &str) -> Option<String> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .find(|l| l.contains(needle))
            .cloned()
    }

    fn join_reader(&mut self) {
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything logged so far.
    pub fn log(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }

    /// Send `sig` (`TERM`, `INT`, …) with kill(1).
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig} failed");
    }

    /// SIGKILL, and reap it: exactly a crash.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.join_reader();
    }

    /// SIGTERM, then [`HostProcess::finish`]'s exit code.
    pub fn term(&mut self) -> Option<i32> {
        self.signal("TERM");
        self.wait_exit()
    }

    /// Wait (at most 60 s, then kill and fail) for the exit: its code and
    /// the whole log.
    pub fn finish(mut self) -> (Option<i32>, String) {
        let code = self.wait_exit();
        (code, self.log())
    }

    /// Still running (not exited yet).
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Wait (at most 60 s, then kill and fail) for the exit; its code.
    pub fn wait(&mut self) -> Option<i32> {
        self.wait_exit()
    }

    fn wait_exit(&mut self) -> Option<i32> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                self.kill();
                panic!("host did not exit within 60 s:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        self.join_reader();
        status.code()
    }
}

impl Drop for HostProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
