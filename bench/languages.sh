#!/usr/bin/env bash
# Plugins in Rust, Python and JavaScript, side by side (docs/benchmarks.md,
# session 22):
#   bash bench/languages.sh
# 1. Map speed: the company map of each language under `host test` over
#    EVENTS (10000) Maxwell company events of one partition (one batch),
#    µs per record = (time for EVENTS+1 events − time for 1 event) / EVENTS,
#    the median of ROUNDS (5) interleaved runs; and the loop a hand-written
#    Python consumer runs per message (bench/py_consumer.py: json.loads,
#    filter, json.dumps of the key and the row) over the same events.
# 2. Start: component size; cold start = `host plugin inspect` with the
#    compile cache off (compile + load); cached start = the same with the
#    cache; instantiation = the host's debug line `instantiated` (µs).
# 3. Host peak RSS (/usr/bin/time) of the EVENTS-event `host test`.
# Needs the release host (`cargo build --release -p host`), the release
# Rust company (`cargo build --release --target wasm32-wasip2 -p company`)
# and the Python and JavaScript ones (target/python/company.wasm,
# target/js/company.wasm, built by scripts/test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
T=${CARGO_TARGET_DIR:-target}
HOST=$T/release/host
EVENTS=${EVENTS:-10000}
ROUNDS=${ROUNDS:-5}
declare -A PLUGIN=([rust]=$T/wasm32-wasip2/release/company.wasm [python]=$T/python/company.wasm [js]=$T/js/company.wasm)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# Events shaped as bench/src/lib.rs generates them (`produce`), as
# `host test --format records` lines.
python3 - "$EVENTS" "$WORK" <<'PY'
import json, sys
n, work = int(sys.argv[1]), sys.argv[2]
lines, seen = [], set()
for i in range(1, n + 2):
    cid = (i * 7919) % max(1, n // 4) + 1
    kind = "delete" if i % 50 == 0 and cid in seen else ("update" if cid in seen else "insert")
    (seen.discard if kind == "delete" else seen.add)(cid)
    row = f'{{"id":{cid},"name":"Company {cid}","valuation":{999_999_000_000 + cid}.{i % 1_000_000:06},"founded":"0000-00-00 00:00:00"}}'
    value = f'{{"database":"shop","table":"company","type":"{kind}","ts":{1_700_000_000 + i},"xid":{i * 3},"commit":true,"data":{row}}}'
    key = f'{{"database":"shop","table":"company","pk.id":{cid}}}'
    lines.append(json.dumps({"topic": "maxwell", "partition": 0, "offset": i - 1, "key": key, "value": value}))
open(f"{work}/one.jsonl", "w").write(lines[0] + "\n")
open(f"{work}/many.jsonl", "w").write("\n".join(lines) + "\n")
open(f"{work}/values.txt", "w").write("\n".join(json.loads(l)["value"] for l in lines[1:]) + "\n")
PY

seconds() { # seconds of `host test --plugin $1 --input $2`
  local s e
  s=$(date +%s.%N)
  RUST_LOG=warn "$HOST" test --plugin "$1" --format records --input "$2" >/dev/null
  e=$(date +%s.%N)
  python3 -c "print($e - $s)"
}
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

for lang in rust python js; do "$HOST" test --plugin "${PLUGIN[$lang]}" --format records --input "$WORK/one.jsonl" >/dev/null 2>&1; done # compile once
declare -A PER
for lang in rust python js; do : > "$WORK/$lang.us"; done
for _ in $(seq "$ROUNDS"); do
  for lang in rust python js; do
    many=$(seconds "${PLUGIN[$lang]}" "$WORK/many.jsonl")
    one=$(seconds "${PLUGIN[$lang]}" "$WORK/one.jsonl")
    python3 -c "print(($many - $one) / $EVENTS * 1e6)" >> "$WORK/$lang.us"
  done
done
for lang in rust python js; do PER[$lang]=$(median < "$WORK/$lang.us"); done
LOOP=$(python3 - "$WORK/values.txt" "$ROUNDS" <<'PY'
import json, sys, time
values = [l.rstrip("\n").encode() for l in open(sys.argv[1])]
best = []
for _ in range(int(sys.argv[2])):
    s = time.perf_counter()
    for v in values:
        ev = json.loads(v)
        if ev.get("table") != "company" or "data" not in ev:
            continue
        pk = json.dumps({"id": ev["data"]["id"]}, separators=(",", ":"))
        row = json.dumps(ev["data"], separators=(",", ":"))
    best.append((time.perf_counter() - s) / len(values) * 1e6)
print(sorted(best)[len(best) // 2])
PY
)

printf '| plugin | map µs/record | records/s (map) | component | cold start | cached start | instantiate | host peak RSS |\n'
printf '|---|---:|---:|---:|---:|---:|---:|---:|\n'
for lang in rust python js; do
  P=${PLUGIN[$lang]}
  size=$(stat -c %s "$P")
  s=$(date +%s.%N); SLUICE_NO_COMPILE_CACHE=1 "$HOST" plugin inspect "$P" >/dev/null; e=$(date +%s.%N)
  cold=$(python3 -c "print($e - $s)")
  s=$(date +%s.%N); "$HOST" plugin inspect "$P" >/dev/null; e=$(date +%s.%N)
  cached=$(python3 -c "print($e - $s)")
  inst=$(RUST_LOG=sluice_host::plugin=debug "$HOST" test --plugin "$P" --format records --input "$WORK/one.jsonl" 2>&1 >/dev/null \
    | sed -n 's/.*micros=\([0-9]*\).*instantiated.*/\1/p; s/.*instantiated.*micros=\([0-9]*\).*/\1/p' | head -1)
  /usr/bin/time -o "$WORK/rss" -f '%M' "$HOST" test --plugin "$P" --format records --input "$WORK/many.jsonl" >/dev/null 2>&1
  rss=$(tail -1 "$WORK/rss")
  python3 -c "print(f'| $lang | {${PER[$lang]}:.1f} | {1e6/${PER[$lang]}:,.0f} | {$size/1048576:.1f} MiB | {$cold:.2f} s | {$cached:.2f} s | {int('${inst:-0}')/1000:.1f} ms | {$rss/1024:.0f} MiB |')"
done
python3 -c "print(f'| hand-written Python loop (json.loads + json.dumps) | {$LOOP:.1f} | {1e6/$LOOP:,.0f} | – | – | – | – | – |')"
