//! Company map throughput: the Wasm plugin (through the host runtime) vs
//! the same logic compiled natively, at batch sizes 1, 100 and 10,000, on
//! ~200-byte Maxwell events. Prints a table.
//!
//! Run with `bash bench/plugin.sh` (builds the release component first), or
//! `cargo bench -p host --bench company_map` with
//! `target/wasm32-wasip2/release/company.wasm` already built.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_guest::wire::Record;
use sluice_guest::{Config, Mapper};
use sluice_host::plugin::{CallContext, Limits, Runtime};

/// `n` keyed Maxwell company events (Kafka key, value): the generator the
/// end-to-end benchmark produces (bench/src/lib.rs), ~200-byte values.
fn events(n: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut source = sluice_bench::Events::new();
    (0..n)
        .map(|_| {
            let (_, key, value) = source.next_event(5000);
            (key.into_bytes(), value.into_bytes())
        })
        .collect()
}

/// Run `f` over `total` records in batches of `batch` for at least
/// `min_time`; records per second.
fn measure(total: usize, min_time: Duration, mut f: impl FnMut() -> usize) -> f64 {
    // Warm up.
    f();
    let started = Instant::now();
    let mut done = 0usize;
    while started.elapsed() < min_time || done < total {
        done += f();
    }
    done as f64 / started.elapsed().as_secs_f64()
}

fn main() {
    let wasm = std::env::var_os("SLUICE_BENCH_WASM")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../target/wasm32-wasip2/release/company.wasm")
        });
    if !wasm.exists() {
        eprintln!(
            "{} is missing: build it with `cargo build --target wasm32-wasip2 --release -p company` (bench/plugin.sh does)",
            wasm.display()
        );
        std::process::exit(2);
    }
    let min_time = Duration::from_millis(
        std::env::var("SLUICE_BENCH_MS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(3000),
    );
    let rt = Runtime::new(Limits::default()).expect("runtime");
    let plugin = rt
        .load(&wasm, Arc::new(BTreeMap::new()))
        .expect("load company.wasm");
    let mut instance = plugin.instance();
    let mut native = company::Company::new(&Config::default()).expect("native mapper");
    let ctx = CallContext::default();
    let payloads = events(10_000);
    let avg = payloads.iter().map(|(_, v)| v.len()).sum::<usize>() / payloads.len();

    println!(
        "company map, keyed {avg}-byte Maxwell events, {} ms per cell",
        min_time.as_millis()
    );
    println!(
        "{:>7} | {:>14} | {:>14} | {:>11}",
        "batch", "native rec/s", "wasm rec/s", "wasm/native"
    );
    println!("{:->7}-+-{:->14}-+-{:->14}-+-{:->11}", "", "", "", "");
    // SLUICE_BENCH_ONLY=native|wasm runs one side (for profiling).
    let only = std::env::var("SLUICE_BENCH_ONLY").unwrap_or_default();
    let sizes: Vec<usize> = match std::env::var("SLUICE_BENCH_BATCHES") {
        Err(_) => vec![1, 100, 10_000],
        Ok(s) => match s.split(',').map(|b| b.trim().parse()).collect() {
            Ok(v) => v,
            Err(e) => {
                eprintln!("SLUICE_BENCH_BATCHES={s}: {e} (expected e.g. 100,10000)");
                std::process::exit(2);
            }
        },
    };
    for batch in sizes {
        let batch = batch.clamp(1, payloads.len());
        let records: Vec<Record<'_>> = payloads[..batch]
            .iter()
            .enumerate()
            .map(|(i, (k, v))| Record {
                key: Some(k),
                ..Record::with_value("maxwell", 0, i as i64, v)
            })
            .collect();
        let n = if only == "wasm" {
            f64::NAN
        } else {
            measure(20_000, min_time, || {
                let out =
                    sluice_guest::testing::map_records(&mut native, &records).expect("native map");
                assert!(out.rejected.is_empty());
                batch
            })
        };
        let w = if only == "native" {
            f64::NAN
        } else {
            measure(20_000, min_time, || {
                let out = instance.map(&ctx, &records).expect("wasm map");
                assert!(out.rejected.is_empty());
                batch
            })
        };
        println!("{batch:>7} | {n:>14.0} | {w:>14.0} | {:>10.2}x", w / n);
    }
}
