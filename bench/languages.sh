#!/usr/bin/env bash
# Plugins in Rust, Python and JavaScript, side by side (docs/benchmarks.md,
# session 22):
#   bash bench/languages.sh
# 1. Map speed: the company pipeline of each language over EVENTS (20000)
#    Maxwell company events of one partition from `produce`, on
#    librdkafka's mock cluster (mock-broker), into SQLite, in batches of
#    BATCH (10000) records: the map's µs per record from the progress
#    lines (`durations_ms.map` summed over the batches), and whole-process
#    records/s; the best of ROUNDS (3) interleaved runs. Beside them, the
#    loop a hand-written Python consumer runs per message
#    (bench/py_consumer.py: json.loads, filter, json.dumps of the key and
#    the row) over the same events' values.
# 2. Start: component size; cold start = `host plugin inspect` with the
#    compile cache off (compile + load); cached start = the same with the
#    cache; instantiation = the host's debug line `instantiated` (µs).
# 3. Host peak RSS (/usr/bin/time) of the pipeline run.
# Needs the release host, produce and mock-broker (`cargo build --release
# -p host -p sluice-bench`), the release Rust company (`cargo build
# --release --target wasm32-wasip2 -p company`) and the Python and
# JavaScript ones (target/python/company.wasm, target/js/company.wasm,
# built by scripts/test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
T=${CARGO_TARGET_DIR:-target}
R=$T/release
HOST=$R/host
EVENTS=${EVENTS:-20000}
BATCH=${BATCH:-10000}
ROUNDS=${ROUNDS:-3}
declare -A PLUGIN=([rust]=$T/wasm32-wasip2/release/company.wasm [python]=$T/python/company.wasm [js]=$T/js/company.wasm)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
exec 3< <(sleep 3600 | $R/mock-broker maxwell 1)
read -r BOOT <&3
$R/produce "$BOOT" maxwell 1 "$EVENTS" "$WORK/expected.json" >/dev/null 2>&1

run() { # one pipeline run of plugin $1: prints "map_us_per_record records_per_s peak_rss_kib"
  rm -rf "$WORK/ck" "$WORK/sink.db"
  local s e
  s=$(date +%s.%N)
  RUST_LOG=warn /usr/bin/time -o "$WORK/rss" -f '%M' "$HOST" run --brokers "$BOOT" --topic maxwell \
    --checkpoint "$WORK/ck" --plugin "$1" --until-caught-up --max-records-per-partition "$BATCH" \
    --trigger-interval 10ms --sink-db "sqlite:$WORK/sink.db" --progress json > "$WORK/progress.jsonl"
  e=$(date +%s.%N)
  python3 - "$WORK/progress.jsonl" "$EVENTS" "$s" "$e" "$(tail -1 "$WORK/rss")" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
batches = [l for l in lines if "durations_ms" in l]
records = sum(b["counts"]["input"] for b in batches)
map_ms = sum(b["durations_ms"]["map"] for b in batches)
n, s, e, rss = int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
assert records == n, f"{records} records in the progress lines, {n} produced"
print(map_ms * 1000 / records, n / (e - s), rss)
PY
}

for lang in rust python js; do run "${PLUGIN[$lang]}" >/dev/null; done # warm-up: compile once
for lang in rust python js; do : > "$WORK/$lang.runs"; done
for _ in $(seq "$ROUNDS"); do
  for lang in rust python js; do run "${PLUGIN[$lang]}" >> "$WORK/$lang.runs"; done
done
LOOP=$(python3 - "$ROUNDS" <<'PY'
import json, sys, time
# The values `produce` generates (bench/src/lib.rs), rebuilt here.
values, seen = [], set()
for i in range(1, 20001):
    cid = (i * 7919) % 5000 + 1
    kind = "delete" if i % 50 == 0 and cid in seen else ("update" if cid in seen else "insert")
    (seen.discard if kind == "delete" else seen.add)(cid)
    row = f'{{"id":{cid},"name":"Company {cid}","valuation":{999_999_000_000 + cid}.{i % 1_000_000:06},"founded":"0000-00-00 00:00:00"}}'
    values.append(f'{{"database":"shop","table":"company","type":"{kind}","ts":{1_700_000_000 + i},"xid":{i * 3},"commit":true,"data":{row}}}'.encode())
best = []
for _ in range(int(sys.argv[1])):
    s = time.perf_counter()
    for v in values:
        ev = json.loads(v)
        if ev.get("table") != "company" or "data" not in ev:
            continue
        pk = json.dumps({"id": ev["data"]["id"]}, separators=(",", ":"))
        row = json.dumps(ev["data"], separators=(",", ":"))
    best.append((time.perf_counter() - s) / len(values) * 1e6)
print(min(best))
PY
)

printf '| plugin | map µs/record | map records/s | pipeline records/s (SQLite) | component | cold start | cached start | instantiate | host peak RSS |\n'
printf '|---|---:|---:|---:|---:|---:|---:|---:|---:|\n'
for lang in rust python js; do
  P=${PLUGIN[$lang]}
  read -r map rps rss < <(sort -g "$WORK/$lang.runs" | head -1)
  best_rps=$(sort -g -k2 "$WORK/$lang.runs" | tail -1 | cut -d' ' -f2)
  size=$(stat -c %s "$P")
  s=$(date +%s.%N); SLUICE_NO_COMPILE_CACHE=1 "$HOST" plugin inspect "$P" >/dev/null; e=$(date +%s.%N)
  cold=$(python3 -c "print($e - $s)")
  s=$(date +%s.%N); "$HOST" plugin inspect "$P" >/dev/null; e=$(date +%s.%N)
  cached=$(python3 -c "print($e - $s)")
  printf 'x\n' > "$WORK/one.txt"
  inst=$(RUST_LOG=sluice_host::plugin=debug "$HOST" test --plugin "$P" --input "$WORK/one.txt" 2>&1 >/dev/null \
    | sed -n 's/.*micros=\([0-9]*\).*/\1/p' | head -1)
  python3 -c "print(f'| $lang | {$map:.1f} | {1e6/$map:,.0f} | {$best_rps:,.0f} | {$size/1048576:.1f} MiB | {$cold:.2f} s | {$cached:.2f} s | {${inst:-0}/1000:.1f} ms | {$rss/1024:.0f} MiB |')"
done
python3 -c "print(f'| hand-written Python loop (json.loads + json.dumps) | {$LOOP:.1f} | {1e6/$LOOP:,.0f} | – | – | – | – | – | – |')"
