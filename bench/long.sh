#!/usr/bin/env bash
# Steady-state benchmark (not part of the test run): bench/long.py (1,000,000
# events on 64 partitions by default; see it for the knobs: RUNS, EVENTS,
# PARTITIONS, BATCH, SKIP_PYTHON) after the release builds and installs of
# bench/run.sh.
set -euo pipefail
BENCH_SCRIPT=long.py exec bash "$(dirname "$0")/run.sh"
