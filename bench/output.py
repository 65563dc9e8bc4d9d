#!/usr/bin/env python3
"""Topic to topic: Sluice's passthrough map with --output-topic, exactly
once and at-least-once, against the loops users write for the same copy.

One librdkafka mock cluster (its own process, in memory: the broker is
not what is measured) holds the input, EVENTS Maxwell company events
(~200 bytes, keyed) over PARTITIONS partitions, produced once before
timing, and one fresh output topic of as many partitions per timed run.
Cells, each the median of RUNS interleaved runs, whole-process wall time:

- sluice exactly once: `host run --plugin passthrough.wasm --output-topic
  OUT --until-caught-up` (a transaction per batch, default
  --max-records-per-partition 10000);
- sluice at-least-once: the same with `--output-guarantee at-least-once`;
- sluice sink sending: the router sink stage (no map) sending each event
  with `kafka.send` (the `kafka` capability), exactly once: it parses each
  event's JSON for a field it lacks and sends it to its fallback topic;
- sluice group exactly once / at-least-once: the passthrough as the one
  member of a pipeline group (`--group`, its checkpoint in a SQLite
  `--sink-db`): exactly once commits a transaction per part on each input
  partition's own producer (64 producers), then the part's progress row;
  the at-least-once cell shows what the group costs without them;
- Rust loop (bench/src/bin/copy-loop.rs): rdkafka consume, produce, flush;
- Rust loop with transactions: the same, committing a transaction with
  the input positions every TXN records (default 640000, Sluice's batch
  of 10000 records on each of 64 partitions);
- Python loop (bench/py_copy_loop.py): confluent-kafka, at-least-once.

Every run's output topic must then hold at least EVENTS records (high
watermarks summed; transaction markers add a few). Prints a markdown
table. Run with `bash bench/output.sh`. Environment: RUNS (default 3),
EVENTS (default 1000000), PARTITIONS (default 64), TXN, SKIP_PYTHON=1.
"""
import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("EVENTS", "1000000")
os.environ.setdefault("PARTITIONS", "64")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (the shared timing and medians)

from confluent_kafka import Consumer, TopicPartition  # noqa: E402

TXN = int(os.environ.get("TXN", "640000"))
CELLS = ["sluice_eo", "sluice_alo", "sluice_send", "sluice_group_eo", "sluice_group_alo", "rust", "rust_txn",
         "python"]
LABELS = {
    "sluice_eo": "Sluice passthrough, exactly once (a transaction per batch)",
    "sluice_alo": "Sluice passthrough, at-least-once",
    "sluice_send": "Sluice router sink, kafka.send, exactly once",
    "sluice_group_eo": "Sluice passthrough, pipeline group of one, exactly once (a transaction per part)",
    "sluice_group_alo": "Sluice passthrough, pipeline group of one, at-least-once",
    "rust": "Rust loop (rdkafka), at-least-once",
    "rust_txn": f"Rust loop (rdkafka), a transaction every {TXN} records",
    "python": "Python loop (confluent-kafka), at-least-once",
}


def produced(bootstrap, topic):
    """Records in `topic` (its partitions' high watermarks, summed)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-output-check"})
    try:
        parts = c.list_topics(topic, timeout=30).topics[topic].partitions
        return sum(c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in parts)
    finally:
        c.close()


def main():
    cells = [c for c in CELLS if not (c == "python" and os.environ.get("SKIP_PYTHON"))]
    topics = ["maxwell", str(run.PARTS)]
    for c in cells:
        for i in range(run.RUNS):
            topics += [f"out-{c}-{i}", str(run.PARTS)]
    work = tempfile.mkdtemp(prefix="sluice-bench-output-")
    broker = subprocess.Popen([os.path.join(run.REL, "mock-broker")] + topics, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    bootstrap = broker.stdout.readline().strip()
    try:
        subprocess.run([os.path.join(run.REL, "produce"), bootstrap, "maxwell", str(run.PARTS), str(run.EVENTS),
                        os.path.join(work, "expected.json")], check=True, capture_output=True)

        def check(out):
            n = produced(bootstrap, out)
            if n < run.EVENTS:
                raise RuntimeError(f"{out} holds {n} records, expected at least {run.EVENTS}")

        def sluice(guarantee, name, sends=False, group=False):
            def cell(i):
                out = f"out-{name}-{i}"
                plugin = ["--plugin", os.path.join(run.WASM, "passthrough.wasm")]
                if sends:
                    plugin = ["--plugin", os.path.join(run.WASM, "router.wasm"),
                              "--config", "route.field=not_in_maxwell_events", "--config", f"route.topic={out}"]
                store = ["--checkpoint", os.path.join(work, f"ck-{out}")]
                if group:
                    store = ["--group", f"g-{out}", "--sink-db", "sqlite:" + os.path.join(work, f"{out}.db")]
                args = [run.HOST, "run", "--brokers", bootstrap, "--topic", "maxwell"] + store + plugin + [
                        "--until-caught-up", "--progress", "json", "--trigger-interval", "10ms",
                        "--output-topic", out, "--output-guarantee", guarantee]
                wall, rss, stdout = run.timed(args, env=dict(os.environ, RUST_LOG="warn"))
                events = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
                n = sum(e["counts"]["produced"] for e in events)
                if n != run.EVENTS:
                    raise RuntimeError(f"sluice produced {n}")
                check(out)
                txn = sum(e["durations_ms"].get("transaction", 0) for e in events)
                return run.EVENTS / wall, rss, len(events), txn
            return cell

        def loop(cmd, name):
            def cell(i):
                out = f"out-{name}-{i}"
                wall, rss, stdout = run.timed(cmd + [bootstrap, "maxwell", out])
                if int(stdout.split()[0]) != run.EVENTS:
                    raise RuntimeError(f"{name} copied {stdout}")
                check(out)
                return run.EVENTS / wall, rss
            return cell

        copy = os.path.join(run.REL, "copy-loop")
        fns = {
            "sluice_eo": sluice("exactly-once", "sluice_eo"),
            "sluice_alo": sluice("at-least-once", "sluice_alo"),
            "sluice_send": sluice("exactly-once", "sluice_send", sends=True),
            "sluice_group_eo": sluice("exactly-once", "sluice_group_eo", group=True),
            "sluice_group_alo": sluice("at-least-once", "sluice_group_alo", group=True),
            "rust": loop([copy], "rust"),
            "rust_txn": lambda i: loop_txn(copy, bootstrap, i, check),
            "python": loop([run.PY, os.path.join(run.ROOT, "bench", "py_copy_loop.py")], "python"),
        }
        res, errors = run.interleaved({c: fns[c] for c in cells})
    finally:
        broker.stdin.close()
        broker.wait()
    print(f"{run.EVENTS} Maxwell events (~200 bytes, keyed) over {run.PARTS} partitions copied to a topic of "
          f"{run.PARTS} partitions on librdkafka's mock cluster; medians of {run.RUNS} interleaved runs; "
          "rec/s = events / wall time of the whole process.")
    print()
    print("| system | rec/s | peak RSS MiB | vs Rust loop |")
    print("|---|---:|---:|---:|")
    base = res.get("rust", (None,))[0]
    for c in cells:
        if c in errors:
            print(f"| {LABELS[c]} | failed: {errors[c]} | | |")
            continue
        rate, pick = res[c]
        ratio = f"{rate / base:.2f}x" if base else ""
        extra = ""
        if c in ("sluice_eo", "sluice_send", "sluice_group_eo"):
            extra = f" ({pick[2]} batches, {pick[3]:.0f} ms in transaction commits)"
        print(f"| {LABELS[c]}{extra} | {rate:,.0f} | {pick[1]:.0f} | {ratio} |")


def loop_txn(copy, bootstrap, i, check):
    out = f"out-rust_txn-{i}"
    wall, rss, stdout = run.timed([copy, bootstrap, "maxwell", out, "--transactional", str(TXN)])
    if int(stdout.split()[0]) != run.EVENTS:
        raise RuntimeError(f"rust_txn copied {stdout}")
    check(out)
    return run.EVENTS / wall, rss


main()
