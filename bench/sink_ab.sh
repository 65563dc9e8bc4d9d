#!/usr/bin/env bash
# A/B of two company.wasm builds under one release host, SQLite and
# PostgreSQL sinks, interleaved (docs/benchmarks.md, session 14):
#   BEFORE=/path/old/company.wasm PG_URL=postgres://…/postgres bash bench/sink_ab.sh
# AFTER defaults to this tree's release company.wasm; EVENTS (200000),
# PARTITIONS (16), ROUNDS (2). Needs the release builds of bench/run.sh and
# psql on PATH (scripts/pg.sh's bin dir). Prints whole-process rec/s.
set -euo pipefail
cd "$(dirname "$0")/.."
R=target/release
AFTER=${AFTER:-target/wasm32-wasip2/release/company.wasm}
EVENTS=${EVENTS:-200000}
PARTS=${PARTITIONS:-16}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
exec 3< <(sleep 3600 | $R/mock-broker maxwell "$PARTS")
read -r BOOT <&3
$R/produce "$BOOT" maxwell "$PARTS" "$EVENTS" "$WORK/expected.json" >/dev/null
for round in $(seq "${ROUNDS:-2}"); do
  for side in before after; do
    if [ "$side" = before ]; then P=$BEFORE; else P=$AFTER; fi
    for db in sqlite postgres; do
      rm -rf "$WORK/ck" "$WORK/sink.db"
      if [ "$db" = sqlite ]; then URL="sqlite:$WORK/sink.db"; else
        N="ab_${side}_${round}"
        psql "$PG_URL" -qc "DROP DATABASE IF EXISTS $N" -c "CREATE DATABASE $N" >/dev/null 2>&1
        URL="${PG_URL%/*}/$N"
      fi
      S=$(date +%s.%N)
      RUST_LOG=warn $R/host run --brokers "$BOOT" --topic maxwell --checkpoint "$WORK/ck" --plugin "$P" \
        --until-caught-up --max-records-per-partition 2000 --trigger-interval 10ms --sink-db "$URL" >/dev/null
      E=$(date +%s.%N)
      python3 -c "print(f'round $round  $side  $db  {$EVENTS/($E-$S):,.0f} rec/s')"
    done
  done
done
