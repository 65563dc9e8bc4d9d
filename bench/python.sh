#!/usr/bin/env bash
# The company pipeline with the Rust plugin and with its Python port
# (plugins/python/company, componentize-py), interleaved, whole-process
# records/s into SQLite (docs/benchmarks.md, session 21):
#   bash bench/python.sh
# Needs the release host, produce and mock-broker (`cargo build --release
# -p host -p sluice-bench`), the release Rust company
# (`cargo build --release --target wasm32-wasip2 -p company`) and the
# Python one (PY_COMPANY, default target/python/company.wasm, built by
# scripts/test.sh). EVENTS (20000), PARTITIONS (4), ROUNDS (2). The first
# run of each plugin includes its compile unless the compile cache has it,
# so a warm-up run of each comes first.
set -euo pipefail
cd "$(dirname "$0")/.."
T=${CARGO_TARGET_DIR:-target}
R=$T/release
RUST=$T/wasm32-wasip2/release/company.wasm
PY=${PY_COMPANY:-$T/python/company.wasm}
EVENTS=${EVENTS:-20000}
PARTS=${PARTITIONS:-4}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
exec 3< <(sleep 3600 | $R/mock-broker maxwell "$PARTS")
read -r BOOT <&3
$R/produce "$BOOT" maxwell "$PARTS" "$EVENTS" "$WORK/expected.json" >/dev/null 2>&1
run() {
  rm -rf "$WORK/ck" "$WORK/sink.db"
  RUST_LOG=warn $R/host run --brokers "$BOOT" --topic maxwell --checkpoint "$WORK/ck" --plugin "$1" \
    --until-caught-up --max-records-per-partition 2000 --trigger-interval 10ms \
    --sink-db "sqlite:$WORK/sink.db" >/dev/null
}
run "$RUST"; run "$PY"   # warm-up: compile (or load from the compile cache)
printf '| round | plugin | records/s |\n|---|---|---:|\n'
for round in $(seq "${ROUNDS:-2}"); do
  for side in rust python; do
    if [ "$side" = rust ]; then P=$RUST; else P=$PY; fi
    S=$(date +%s.%N); run "$P"; E=$(date +%s.%N)
    python3 -c "print(f'| $round | $side | {$EVENTS/($E-$S):,.0f} |')"
  done
done
