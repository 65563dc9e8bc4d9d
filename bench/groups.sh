#!/usr/bin/env bash
# Pipeline-group benchmark (not part of the test run): builds the host, the
# sql-counter fixture and the benchmark helpers in release mode, starts a
# throwaway PostgreSQL (scripts/pg.sh; fsync off), then runs
# bench/groups.py (see it for the knobs: RUNS, EVENTS, RATE, SKIP_TANSU).
set -euo pipefail
cd "$(dirname "$0")/.."
rustup target add wasm32-wasip2 >/dev/null
cargo build --release --target wasm32-wasip2 -p sql-counter -p company
cargo build --release -p host -p sluice-bench
# shellcheck source=scripts/pg.sh
source scripts/pg.sh
pg_start
trap pg_stop EXIT
BENCH_PG_URL=$SLUICE_TEST_PG_URL PSQL=$SLUICE_PG_BIN/psql \
  TANSU=${TANSU:-${SLUICE_TOOLS:-$HOME/.cache/sluice-tools}/bin/tansu} python3 bench/groups.py
