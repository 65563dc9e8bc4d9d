#!/usr/bin/env python3
"""Steady-state benchmark: a long run per system on the mock cluster.

The short table (bench/run.py) times 60,000 events, where start-up, plugin
load and consumer close weigh as much as the work. This one produces
EVENTS (default 1,000,000) Maxwell company events over PARTITIONS
(default 64: librdkafka's mock cluster keeps at most 5 MiB per partition
and drops the oldest message sets past it (rdkafka_mock.c), which
1,000,000 ~200-byte events on 48 partitions exceed) and
runs each system over all of them, RUNS times interleaved:

- ceiling: the bare librdkafka consumer (reads and counts);
- passthrough: Sluice with the passthrough plugin, no sink;
- company -> SQLite: Sluice with the company plugin (map + SQL sink);
- python -> SQLite: the hand-written confluent-kafka consumer doing the
  same upserts (bench/py_consumer.py).

Per system: whole-process records/s (wall clock from start to exit),
steady-state records/s for Sluice (from its progress events: the records
of every batch but the first and the last, over the time between the
first batch's commit and the last-but-one's), peak RSS, and CPU seconds
(user + sys) per million records. company's and python's tables are
checked against the producer's expected final state (Sluice's must
match byte for byte; python's must hold the same keys, and the table
says whether its rows are byte-exact).

Run with `bash bench/long.sh` (builds in release mode and installs the
Python baseline first). Environment: RUNS (default 3), EVENTS, PARTITIONS,
BATCH (Sluice's --max-records-per-partition, default 2000: 128,000
records a batch at 64 partitions), SKIP_PYTHON=1.
"""
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (paths, the mock cluster, table_of)

EVENTS = int(os.environ.get("EVENTS", "1000000"))
PARTS = int(os.environ.get("PARTITIONS", "64"))
BATCH = os.environ.get("BATCH", "2000")


def measure(cmd):
    """Run cmd under /usr/bin/time: (wall s, CPU s, peak RSS MiB, stdout)."""
    t0 = time.perf_counter()
    out = subprocess.run(["/usr/bin/time", "-f", "TIME %e %U %S %M"] + cmd, capture_output=True, text=True,
                         env=dict(os.environ, RUST_LOG="warn"))
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    _, _, user, sys_, rss = [l for l in out.stderr.splitlines() if l.startswith("TIME ")][-1].split()
    return wall, float(user) + float(sys_), int(rss) / 1024.0, out.stdout


def steady(progress):
    """Records/s between the first batch's commit and the last-but-one's,
    over the batches in between; None with fewer than three batches."""
    if len(progress) < 3:
        return None
    at = [datetime.datetime.fromisoformat(b["committed_at"].replace("Z", "+00:00")) for b in progress]
    seconds = (at[-2] - at[0]).total_seconds()
    records = sum(b["counts"]["input"] for b in progress[1:-1])
    return records / seconds if seconds > 0 else None


def main():
    with tempfile.TemporaryDirectory(prefix="bench-long-") as work, run.Mock(partitions=PARTS) as b:
        expected_file = os.path.join(work, "expected.json")
        subprocess.run([os.path.join(run.REL, "produce"), b.bootstrap, "maxwell", str(PARTS), str(EVENTS),
                        expected_file], check=True, capture_output=True)
        with open(expected_file) as f:
            expected = json.load(f)

        def sluice(plugin, sink, i):
            ck = os.path.join(work, f"ck-{plugin}-{i}")
            args = [run.HOST, "run", "--brokers", b.bootstrap, "--topic", "maxwell", "--checkpoint", ck,
                    "--plugin", os.path.join(run.WASM, f"{plugin}.wasm"), "--until-caught-up",
                    "--progress", "json", "--max-records-per-partition", BATCH, "--trigger-interval", "10ms"]
            db = None
            if sink:
                db = os.path.join(work, f"sink-{plugin}-{i}.db")
                args += ["--sink-db", f"sqlite:{db}"]
            wall, cpu, rss, out = measure(args)
            progress = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
            n = sum(p["counts"]["input"] for p in progress)
            if n != EVENTS:
                raise RuntimeError(f"sluice read {n} records, expected {EVENTS}")
            if db and run.table_of(db) != expected:
                raise RuntimeError("company's table differs from the expected one")
            return {"wall": wall, "cpu": cpu, "rss": rss, "steady": steady(progress), "batches": len(progress),
                    "exact": True if db else None}

        def bare(i):
            wall, cpu, rss, out = measure([os.path.join(run.REL, "bare-consumer"), b.bootstrap, "maxwell"])
            if int(out.split()[0]) != EVENTS:
                raise RuntimeError(f"bare consumer read {out.split()[0]}")
            return {"wall": wall, "cpu": cpu, "rss": rss, "steady": None, "batches": None, "exact": None}

        def python(i):
            db = os.path.join(work, f"py-{i}.db")
            wall, cpu, rss, _ = measure([run.PY, os.path.join(run.ROOT, "bench", "py_consumer.py"), b.bootstrap,
                                         "maxwell", db, "1000"])
            # json.loads/dumps round decimals such as 999999001038.998123
            # through float, so its rows are not byte-exact; it must still
            # hold every primary key.
            table = run.table_of(db)
            if table.keys() != expected.keys():
                raise RuntimeError("python's table has other primary keys than the expected one")
            return {"wall": wall, "cpu": cpu, "rss": rss, "steady": None, "batches": None,
                    "exact": table == expected}

        cells = {
            "ceiling (bare librdkafka consumer)": bare,
            "Sluice passthrough": lambda i: sluice("passthrough", False, i),
            "Sluice company -> SQLite": lambda i: sluice("company", True, i),
        }
        if not os.environ.get("SKIP_PYTHON"):
            cells["python consumer -> SQLite"] = python
        results = {k: [] for k in cells}
        for i in range(run.RUNS):
            for k, fn in cells.items():
                results[k].append(fn(i))

    med = lambda k, f: statistics.median(r[f] for r in results[k])  # noqa: E731
    print(f"{EVENTS:,} Maxwell events, {PARTS} partitions, mock cluster, Sluice batches of "
          f"--max-records-per-partition {BATCH}, median of {run.RUNS} interleaved runs\n")
    print("| system | records/s (whole process) | records/s (steady state) | CPU s per 1M records "
          "| peak RSS MiB | batches | table byte-exact |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for k in cells:
        rate = EVENTS / med(k, "wall")
        steadies = [r["steady"] for r in results[k] if r["steady"]]
        st = f"{statistics.median(steadies):,.0f}" if steadies else "n/a"
        cpu = med(k, "cpu") * 1e6 / EVENTS
        batches = results[k][0]["batches"]
        exact = {True: "yes", False: "no", None: ""}[all(r["exact"] for r in results[k])
                                                     if results[k][0]["exact"] is not None else None]
        print(f"| {k} | {rate:,.0f} | {st} | {cpu:.2f} | {med(k, 'rss'):.0f} | "
              f"{batches if batches is not None else ''} | {exact} |")


if __name__ == "__main__":
    main()
