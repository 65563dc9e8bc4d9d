#!/usr/bin/env bash
# Steady-state benchmark (not part of the test run): bench/long.py (1,000,000
# events on 64 partitions by default; see it for the knobs: RUNS, EVENTS,
# PARTITIONS, BATCH, SKIP_PYTHON, SKIP_PYTHON_PG, SKIP_BYTEWAX) after the release builds and
# installs of bench/run.sh, with a throwaway PostgreSQL (scripts/pg.sh) for
# the PostgreSQL rows unless SKIP_PG=1.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${SKIP_PG:-}" ]; then
  # shellcheck source=scripts/pg.sh
  source scripts/pg.sh
  pg_start
  trap pg_stop EXIT
  export BENCH_PG_URL=$SLUICE_TEST_PG_URL
fi
BENCH_SCRIPT=long.py bash bench/run.sh
