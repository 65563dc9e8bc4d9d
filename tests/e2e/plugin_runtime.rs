//! The sandboxed runtime through the host library API and real built
//! components: deadlines, memory caps, panics, sandbox denials, recovery
//! after traps.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_guest::wire::{self, Record};
use sluice_host::plugin::{CallContext, Limits, PluginError, Runtime, TrapKind};

use crate::support::{plugin, rss_bytes};

fn runtime(timeout_ms: u64, memory: u64) -> Runtime {
    Runtime::new(Limits {
        call_timeout: Duration::from_millis(timeout_ms),
        memory_bytes: memory,
    })
    .expect("runtime")
}

fn values(vals: &[&'static [u8]]) -> Vec<Record<'static>> {
    vals.iter()
        .enumerate()
        .map(|(i, v)| Record::with_value("probe", 3, 100 + i as i64, v))
        .collect()
}

fn first_value(result: &sluice_host::plugin::MapResult) -> String {
    let outs = wire::decode_outputs(&result.outputs).expect("decodable outputs");
    String::from_utf8_lossy(outs[0].value.expect("a value")).into_owned()
}

fn no_config() -> Arc<BTreeMap<String, String>> {
    Arc::new(BTreeMap::new())
}

#[test]
fn a_wasi_sleep_past_the_deadline_traps_at_once_and_says_so() {
    // Found by an attack run: a WASI sleep of 8 s under a 1 s deadline
    // returned after 8.07 s, reported as "deadline exceeded" (a host call
    // is not interrupted by the epoch deadline); a longer one hung the
    // pipeline.
    let rt = runtime(1000, 64 << 20);
    let p = rt.load(&plugin("misbehave"), no_config()).expect("load");
    let mut inst = p.instance();
    let ctx = CallContext::default();
    let started = Instant::now();
    let err = inst.map(&ctx, &values(&[b"sleep"])).expect_err("must trap");
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "the sleep was served: {:?}",
        started.elapsed()
    );
    match &err {
        PluginError::Trap(t) => match t.kind {
            TrapKind::WaitPastDeadline { limit, asked, left } => {
                assert_eq!(limit, Duration::from_millis(1000));
                assert_eq!(asked, Duration::from_millis(8000));
                assert!(left <= limit, "{left:?}");
            }
            ref other => panic!("expected a wait past the deadline, got {other}"),
        },
        other => panic!("expected a trap, got {other}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("a WASI sleep of 8000 ms would pass the call's deadline of 1000 ms"),
        "{msg}"
    );
    // A sleep within the deadline is served, on a fresh instance.
    let ok = inst.map(&ctx, &values(&[b"nap"])).expect("a short sleep");
    assert_eq!(first_value(&ok), "slept");
}

#[test]
fn runaway_loop_is_stopped_at_the_deadline_and_a_fresh_instance_follows() {
    let rt = runtime(300, 64 << 20);
    let p = rt.load(&plugin("misbehave"), no_config()).expect("load");
    let mut inst = p.instance();
    let ctx = CallContext::default();
    let started = Instant::now();
    let err = inst.map(&ctx, &values(&[b"loop"])).expect_err("must trap");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(300),
        "stopped too early: {took:?}"
    );
    assert!(
        took < Duration::from_millis(300 + 2000),
        "deadline + slack exceeded: {took:?}"
    );
    match &err {
        PluginError::Trap(t) if matches!(t.kind, TrapKind::Timeout { .. }) => {
            let (site, digest, path) = (&t.site, &t.digest, &t.path);
            let TrapKind::Timeout { limit } = &t.kind else {
                unreachable!()
            };
            assert_eq!(*limit, Duration::from_millis(300));
            assert_eq!(site, "probe/3 offset 100");
            assert_eq!(digest, p.digest());
            assert!(path.ends_with("misbehave.wasm"));
        }
        other => panic!("expected a timeout trap, got {other}"),
    }
    let msg = err.to_string();
    assert!(msg.contains("deadline of 300 ms exceeded"), "{msg}");

    let ok = inst
        .map(&ctx, &values(&[b"fine"]))
        .expect("fresh instance works");
    assert_eq!(first_value(&ok), "fine");
    assert_eq!(
        inst.instantiations(),
        2,
        "the trapped instance was replaced"
    );
}

#[test]
fn memory_hog_is_trapped_at_the_cap() {
    let cap = 48 << 20;
    let rt = runtime(10_000, cap);
    let p = rt.load(&plugin("misbehave"), no_config()).expect("load");
    let mut inst = p.instance();
    let err = inst
        .map(&CallContext::default(), &values(&[b"alloc"]))
        .expect_err("must trap");
    match &err {
        PluginError::Trap(t) if matches!(t.kind, TrapKind::OutOfMemory { .. }) => {
            let TrapKind::OutOfMemory { limit, requested } = &t.kind else {
                unreachable!()
            };
            assert_eq!(*limit, cap);
            assert!(*requested > cap, "requested {requested} <= cap");
        }
        other => panic!("expected out of memory, got {other}"),
    }
    assert!(
        err.to_string()
            .contains("memory cap of 50331648 bytes exceeded")
    );
    let ok = inst
        .map(&CallContext::default(), &values(&[b"x"]))
        .expect("recovers");
    assert_eq!(first_value(&ok), "x");
}

#[test]
fn panic_message_reaches_the_error() {
    let rt = runtime(10_000, 64 << 20);
    let p = rt.load(&plugin("misbehave"), no_config()).expect("load");
    let mut inst = p.instance();
    let err = inst
        .map(&CallContext::default(), &values(&[b"ok", b"panic"]))
        .expect_err("must trap");
    match &err {
        PluginError::Trap(t) if matches!(t.kind, TrapKind::Panic { .. }) => {
            let TrapKind::Panic { message } = &t.kind else {
                unreachable!()
            };
            let guest_stderr = &t.guest_stderr;
            assert!(
                message.contains("misbehave panicked on purpose at offset 101"),
                "{message}"
            );
            assert!(guest_stderr.contains("panicked at"), "{guest_stderr}");
        }
        other => panic!("expected a panic, got {other}"),
    }
}

#[test]
fn stack_overflow_is_a_trap_not_a_crash() {
    let rt = runtime(10_000, 64 << 20);
    let p = rt.load(&plugin("misbehave"), no_config()).expect("load");
    let mut inst = p.instance();
    let err = inst
        .map(&CallContext::default(), &values(&[b"stack"]))
        .expect_err("must trap");
    assert!(matches!(err, PluginError::Trap(_)), "{err}");
    assert!(inst.map(&CallContext::default(), &values(&[b"x"])).is_ok());
}

#[test]
fn stage_errors_are_classified() {
    let rt = runtime(10_000, 64 << 20);
    let p = rt.load(&plugin("misbehave"), no_config()).expect("load");
    let mut inst = p.instance();
    let ctx = CallContext::default();
    let fatal = inst.map(&ctx, &values(&[b"fatal"])).expect_err("fatal");
    assert!(!fatal.is_retryable());
    assert!(
        fatal.to_string().contains("fatal error: misbehave gave up"),
        "{fatal}"
    );
    let retry = inst.map(&ctx, &values(&[b"retry"])).expect_err("retryable");
    assert!(retry.is_retryable());
    let bad = inst
        .map(&ctx, &values(&[b"a", b"bad", b"c"]))
        .expect("bad records do not fail the call");
    assert_eq!(bad.rejected.len(), 1);
    assert_eq!(bad.rejected[0].index, 1);
    assert_eq!(wire::decode_outputs(&bad.outputs).unwrap().len(), 2);
    assert_eq!(inst.instantiations(), 1, "stage errors are not traps");
}

#[test]
fn sandbox_denies_files_env_and_network() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let port = listener.local_addr().unwrap().port().to_string();
    let config = Arc::new(BTreeMap::from([("port".to_string(), port)]));
    let rt = runtime(10_000, 64 << 20);
    let p = rt.load(&plugin("misbehave"), config).expect("load");
    let mut inst = p.instance();
    let ctx = CallContext::default();
    for probe in [&b"read-file"[..], b"read-env", b"connect"] {
        let r = inst
            .map(&ctx, &[Record::with_value("t", 0, 0, probe)])
            .expect("probe runs");
        let verdict = first_value(&r);
        assert!(
            verdict.starts_with("denied"),
            "{} was allowed: {verdict}",
            String::from_utf8_lossy(probe)
        );
    }
    assert!(listener.accept().is_err(), "the guest reached the listener");
}

#[test]
fn a_thousand_traps_leave_host_memory_flat() {
    // RSS is the whole process's: measured in a process of its own (this
    // test binary again, running only this test), so that the tests
    // running beside it in this one do not move it.
    const CHILD: &str = "SLUICE_TEST_RSS_CHILD";
    if std::env::var_os(CHILD).is_none() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "plugin_runtime::a_thousand_traps_leave_host_memory_flat",
                "--exact",
                "--test-threads=1",
                "--nocapture",
            ])
            .env(CHILD, "1")
            .output()
            .unwrap();
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("1 passed"),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    let rt = runtime(10_000, 64 << 20);
    let p = rt.load(&plugin("misbehave"), no_config()).expect("load");
    let mut inst = p.instance();
    let ctx = CallContext::default();
    let recs = values(&[b"panic"]);
    for _ in 0..100 {
        assert!(inst.map(&ctx, &recs).is_err());
    }
    let warm = rss_bytes();
    for _ in 0..1000 {
        assert!(inst.map(&ctx, &recs).is_err());
    }
    let after = rss_bytes();
    assert_eq!(inst.instantiations(), 1100);
    let growth = after.saturating_sub(warm);
    assert!(
        growth < 32 << 20,
        "RSS grew by {} MiB over 1,000 traps ({} -> {})",
        growth >> 20,
        warm,
        after
    );
}
