#!/usr/bin/env bash
# Plugin benchmark: company map as a Wasm component vs native, batch sizes
# 1, 100 and 10,000. Prints a table. SLUICE_BENCH_MS sets the time per cell.
set -euo pipefail
cd "$(dirname "$0")/.."
rustup target add wasm32-wasip2 >/dev/null
cargo build --target wasm32-wasip2 --release -p company
cargo bench -p host --bench company_map
