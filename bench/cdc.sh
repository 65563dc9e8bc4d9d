#!/usr/bin/env bash
# The cdc plugin against the company plugin on the same input (not part of
# the test run): builds in release mode, then runs bench/cdc.py.
set -euo pipefail
cd "$(dirname "$0")/.."
rustup target add wasm32-wasip2 >/dev/null
cargo build --release --target wasm32-wasip2 -p company -p cdc
cargo build --release -p host -p sluice-bench
python3 bench/cdc.py
