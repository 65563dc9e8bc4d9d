//! A PostgreSQL cluster of one test's own (initdb in a temp dir, trust
//! auth, a free port on 127.0.0.1), for tests that stop or restart the
//! server, which the suite's shared server must never be. Uses the
//! binaries scripts/pg.sh found (`SLUICE_PG_BIN`); run as the `postgres`
//! user when the tests run as root.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A private cluster; dropped, it is stopped and removed.
pub struct PrivatePg {
    bin: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
}

fn as_owner(bin: &Path, tool: &str, args: &[&str]) -> Command {
    let root = uid() == 0;
    let mut c = if root {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(bin.join(tool));
        c
    } else {
        Command::new(bin.join(tool))
    };
    c.args(args);
    c
}

fn uid() -> u32 {
    // `id -u` keeps the test crate free of another dependency.
    let out = Command::new("id").arg("-u").output().expect("id -u");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(1)
}

impl PrivatePg {
    /// initdb and start it.
    pub fn start() -> PrivatePg {
        let bin = PathBuf::from(
            std::env::var_os("SLUICE_PG_BIN").expect("SLUICE_PG_BIN: run with scripts/test.sh"),
        );
        let dir = tempfile::tempdir().unwrap();
        if uid() == 0 {
            assert!(
                Command::new("chown")
                    .arg("postgres")
                    .arg(dir.path())
                    .status()
                    .unwrap()
                    .success()
            );
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let data = dir.path().join("data");
        let ok = as_owner(
            &bin,
            "initdb",
            &[
                "-D",
                data.to_str().unwrap(),
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
            ],
        )
        .output()
        .unwrap();
        assert!(
            ok.status.success(),
            "{}",
            String::from_utf8_lossy(&ok.stderr)
        );
        let pg = PrivatePg { bin, dir, port };
        pg.pg_ctl("start");
        pg
    }

    fn pg_ctl(&self, what: &str) {
        let data = self.dir.path().join("data");
        let log = self.dir.path().join("server.log");
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            self.port,
            self.dir.path().display()
        );
        let out = as_owner(
            &self.bin,
            "pg_ctl",
            &[
                "-D",
                data.to_str().unwrap(),
                "-l",
                log.to_str().unwrap(),
                "-w",
                "-t",
                "60",
                "-m",
                "fast",
                "-o",
                &opts,
                what,
            ],
        )
        .output()
        .unwrap();
        assert!(
            out.status.success(),
            "pg_ctl {what}: {}{}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Stop the server (fast shutdown: open connections are closed).
    pub fn stop(&self) {
        self.pg_ctl("stop");
    }

    /// Start it again, on the same port.
    pub fn start_again(&self) {
        self.pg_ctl("start");
    }
}

impl Drop for PrivatePg {
    fn drop(&mut self) {
        let data = self.dir.path().join("data");
        let _ = as_owner(
            &self.bin,
            "pg_ctl",
            &["-D", data.to_str().unwrap(), "-m", "immediate", "stop"],
        )
        .output();
    }
}
