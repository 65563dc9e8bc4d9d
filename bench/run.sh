#!/usr/bin/env bash
# Side-by-side benchmarks (not part of the test run). Builds the host, the
# plugins and the benchmark helpers in release mode, installs the Python
# baselines (confluent-kafka, quixstreams, Bytewax, psycopg) into a venv in
# the tools dir and Tansu if missing, then prints one table (also written to
# bench/results.md). See bench/run.py for the knobs (RUNS, EVENTS, ...).
# BENCH_SCRIPT picks another table script of bench/ (bench/long.sh: long.py).
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS=${SLUICE_TOOLS:-$HOME/.cache/sluice-tools}
rustup target add wasm32-wasip2 >/dev/null
cargo build --release --target wasm32-wasip2 -p company -p passthrough
cargo build --release -p host -p sluice-bench
if [ ! -x "$TOOLS/bin/tansu" ]; then
  cargo install tansu --locked --version 0.6.0 --features dynostore,libsql --root "$TOOLS"
fi
if [ ! -x "$TOOLS/venv/bin/python" ]; then
  python3 -m venv "$TOOLS/venv"
fi
"$TOOLS/venv/bin/pip" install -q 'confluent-kafka==2.*' 'quixstreams==3.*' 'bytewax==0.21.*' 'psycopg[binary]==3.*'
TANSU="$TOOLS/bin/tansu" BENCH_PYTHON="$TOOLS/venv/bin/python" "$TOOLS/venv/bin/python" "bench/${BENCH_SCRIPT:-run.py}"
