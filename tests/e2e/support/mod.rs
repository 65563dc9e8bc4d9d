//! What the tests share: paths to the built artefacts, the one process
//! watcher ([`HostProcess`]), the one `host run` argv builder
//! ([`RunArgs`]), the one test database ([`Db`]), the brokers (`kafka`:
//! Apache Kafka processes, librdkafka's mock cluster, a producer), a
//! Maxwell stream and its model (`maxwell`), the counting sink's helpers
//! (`counter`), and small helpers.

#![allow(dead_code)]

pub mod counter;
mod db;
pub mod kafka;
pub mod languages;
pub mod maxwell;
mod private_pg;
mod process;
mod run_args;

pub use db::Db;
pub use private_pg::PrivatePg;
pub use process::HostProcess;
pub use run_args::RunArgs;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The cargo target directory (derived from this test executable's path:
/// `<target>/debug/deps/e2e-…`).
pub fn target_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(dir);
    }
    let exe = std::env::current_exe().expect("test executable path");
    exe.ancestors()
        .nth(3)
        .expect("target dir above target/debug/deps")
        .to_path_buf()
}

/// The `host` binary built next to this test.
pub fn host_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let p = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/debug")
        .join("host");
    assert!(
        p.exists(),
        "{} is missing: build it first (`cargo build -p host`, see the README test command)",
        p.display()
    );
    p
}

/// A plugin in another language built by the test command
/// (scripts/test.sh): `target/LANG/NAME.wasm`, `lang` `python` or `js`.
pub fn guest_plugin(lang: &str, name: &str) -> PathBuf {
    let p = target_dir().join(lang).join(format!("{name}.wasm"));
    assert!(
        p.exists(),
        "{} is missing: the test command (scripts/test.sh) builds the {lang} plugins",
        p.display()
    );
    p
}

/// A plugin component built for wasm32-wasip2 (debug profile unless
/// SLUICE_PLUGIN_DIR says otherwise).
pub fn plugin(name: &str) -> PathBuf {
    let dir = std::env::var_os("SLUICE_PLUGIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("wasm32-wasip2").join("debug"));
    let p = dir.join(format!("{name}.wasm"));
    assert!(
        p.exists(),
        "{} is missing: build the plugins first (`cargo build --target wasm32-wasip2 --workspace --exclude host --exclude sluice-tests`, see the README test command)",
        p.display()
    );
    p
}

/// Run the host binary with `args`.
pub fn host(args: &[&str]) -> Output {
    Command::new(host_bin())
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("spawn host")
}

/// Stdout as lines of JSON.
pub fn json_lines(out: &Output) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}")))
        .collect()
}

/// Stderr as text.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Resident set size of this process, bytes (Linux `/proc/self/statm`).
pub fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("statm resident field");
    pages * 4096
}
