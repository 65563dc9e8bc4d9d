#!/usr/bin/env bash
# Topic to topic (not part of the test run): Sluice's --output-topic,
# exactly once and at-least-once, against hand-written copy loops in Rust
# and Python (bench/output.py: RUNS, EVENTS, PARTITIONS, TXN,
# SKIP_PYTHON). Builds in release mode and installs confluent-kafka into
# the bench venv first.
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS=${SLUICE_TOOLS:-$HOME/.cache/sluice-tools}
rustup target add wasm32-wasip2 >/dev/null
cargo build --release --target wasm32-wasip2 -p passthrough -p router
cargo build --release -p host -p sluice-bench
if [ ! -x "$TOOLS/venv/bin/python" ]; then
  python3 -m venv "$TOOLS/venv"
fi
"$TOOLS/venv/bin/pip" install -q 'confluent-kafka==2.*'
BENCH_PYTHON="$TOOLS/venv/bin/python" "$TOOLS/venv/bin/python" bench/output.py
