#!/usr/bin/env bash
# Profile the host on benchmark rows (2) and (3): passthrough with the
# discarding sink, and company -> SQLite, on the mock cluster. Builds the
# release host with the `profiling` feature (wasmtime writes a perf map, so
# compiled plugin functions have names), records with `perf record -g`
# (cpu-clock: works where hardware counters are not exposed) and prints the
# top functions of each. Not part of the test run.
#
# Environment: EVENTS (default 60000), PARTITIONS (default 6), BATCH
# (--max-records-per-partition, default 20000), TOP (default
# 25 lines), OUT (default target/profile) for the perf.data files.
set -euo pipefail
cd "$(dirname "$0")/.."
EVENTS=${EVENTS:-60000}
PARTS=${PARTITIONS:-6}
TOP=${TOP:-25}
OUT=${OUT:-target/profile}
command -v perf >/dev/null || { echo "perf is missing (Debian: linux-perf)" >&2; exit 2; }
rustup target add wasm32-wasip2 >/dev/null
cargo build --release --target wasm32-wasip2 -p company -p passthrough
cargo build --release -p host -p sluice-bench --features host/profiling
R=target/release
W=target/wasm32-wasip2/release
mkdir -p "$OUT"
coproc MB { "$R/mock-broker" maxwell "$PARTS"; }
# The broker stops when its stdin closes; kill it if this script fails.
trap 'kill "${MB_PID:-}" 2>/dev/null || true' EXIT
read -r BOOT <&"${MB[0]}"
"$R/produce" "$BOOT" maxwell "$PARTS" "$EVENTS" "$OUT/expected.json" >/dev/null
for row in passthrough company; do
  rm -rf "$OUT/ck-$row" "$OUT/sink-$row.db"*
  args=(run --brokers "$BOOT" --topic maxwell --checkpoint "$OUT/ck-$row" --plugin "$W/$row.wasm"
        --until-caught-up --progress json --max-records-per-partition "${BATCH:-20000}" --trigger-interval 10ms)
  [ "$row" = company ] && args+=(--sink-db "sqlite:$OUT/sink-$row.db")
  SLUICE_PERF_MAP=1 RUST_LOG=warn perf record -q -e cpu-clock -F 4000 -g -o "$OUT/$row.data" \
    "$R/host" "${args[@]}" > "$OUT/$row.progress.jsonl"
  echo
  echo "== $row: $(grep -c '^{' "$OUT/$row.progress.jsonl") batch(es); stage times (ms) of the first:"
  head -1 "$OUT/$row.progress.jsonl" | python3 -c 'import json,sys; print(json.load(sys.stdin)["durations_ms"])'
  echo "-- top functions (self time); [JIT] rows are plugin code"
  perf report -i "$OUT/$row.data" --no-children -g none --sort dso,symbol 2>/dev/null \
    | grep "%" | head -n "$TOP" | cut -c1-140 || true
done
exec {MB[1]}>&-
wait
