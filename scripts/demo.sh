#!/usr/bin/env bash
# The demo in one command: builds the host and the company plugin (release)
# and runs `host demo` (embedded Kafka broker, embedded SQLite, a restart,
# a summary). Extra arguments go to `host demo` (e.g. --keep DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
rustup target add wasm32-wasip2 >/dev/null
cargo build --release --target wasm32-wasip2 -p company
cargo build --release -p host
exec "${CARGO_TARGET_DIR:-target}/release/host" demo "$@"
