#!/usr/bin/env bash
# The Sluice test command (README "Test"). Installs what the tests need,
# builds the host and every plugin/fixture component, starts a throwaway
# PostgreSQL, then runs the whole suite: unit tests, SDK tests and the
# end-to-end tests against real built components, real files and real
# databases. Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

step "wasm32-wasip2 target"
rustup target add wasm32-wasip2

step "PostgreSQL (throwaway cluster on 127.0.0.1)"
# shellcheck source=scripts/pg.sh
source scripts/pg.sh
pg_start
trap pg_stop EXIT

step "build plugins and fixtures (wasm32-wasip2, debug)"
cargo build --target wasm32-wasip2 \
  -p company -p passthrough \
  -p misbehave -p wrong-world -p future-version -p sql-counter

step "build host"
cargo build -p host --features failpoints

step "tests"
cargo test --workspace "$@"
