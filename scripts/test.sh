#!/usr/bin/env bash
# The Sluice test command (README "Test"). Installs what the tests need,
# builds the host and every plugin/fixture component, then runs the whole
# suite: unit tests, SDK tests and the end-to-end tests against real built
# components, real files and real services started by the harness.
#
# Environment:
#   SLUICE_TOOLS   where external test tools are installed (default: ~/.cache/sluice-tools)
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

step "wasm32-wasip2 target"
rustup target add wasm32-wasip2

step "build plugins and fixtures (wasm32-wasip2, debug)"
cargo build --target wasm32-wasip2 \
  -p company -p passthrough \
  -p misbehave -p wrong-world -p future-version

step "build host"
cargo build -p host

step "tests"
cargo test --workspace "$@"
