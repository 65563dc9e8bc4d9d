#!/usr/bin/env python3
"""Side-by-side benchmark of Sluice and what users would pick instead.

Same machine, same data (Maxwell company events of ~200 bytes, produced once
per broker before timing), two brokers: librdkafka's in-process mock cluster
(run as its own process) and Tansu with sqlite storage. Every cell is the
median of RUNS runs, run round-robin (every system once per round). Prints
one table (markdown) and writes it to bench/results.md.

Run with `bash bench/run.sh` (it builds everything in release mode first).
Environment: RUNS (default 3), EVENTS (default 60000), PARTITIONS (default 6),
TANSU (path of the tansu binary, or of nisshi: the same command line), SLUICE_HOST (host binary to measure,
default target/release/host), SKIP_QUIX=1, SKIP_PYTHON=1.
"""
import json
import os
import shutil
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REL = os.path.join(ROOT, "target", "release")
WASM = os.path.join(ROOT, "target", "wasm32-wasip2", "release")
HOST = os.environ.get("SLUICE_HOST", os.path.join(REL, "host"))
RUNS = int(os.environ.get("RUNS", "3"))
EVENTS = int(os.environ.get("EVENTS", "60000"))
PARTS = int(os.environ.get("PARTITIONS", "6"))
PY = os.environ.get("BENCH_PYTHON", sys.executable)
TANSU = os.environ.get("TANSU", os.path.expanduser("~/.cache/sluice-tools/bin/tansu"))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def timed(cmd, **kw):
    """Run cmd under /usr/bin/time; (wall seconds, peak RSS MiB, stdout).

    Wall time is taken here with a monotonic clock (µs resolution; time's
    own %e has only 10 ms), so it includes time's fork and exec (~1 ms)."""
    t0 = time.perf_counter()
    out = subprocess.run(["/usr/bin/time", "-f", "TIME %e %M"] + cmd, capture_output=True, text=True, **kw)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    line = [l for l in out.stderr.splitlines() if l.startswith("TIME ")][-1]
    rss = line.split()[2]
    return wall, int(rss) / 1024.0, out.stdout


def table_of(db, pk="pk", row="row_json"):
    c = sqlite3.connect(db)
    try:
        return dict(c.execute(f"SELECT {pk}, {row} FROM companies").fetchall())
    finally:
        c.close()


class Mock:
    name = "mock cluster"

    def __init__(self, topic="maxwell", partitions=None):
        self.topic = topic
        self.partitions = partitions or PARTS

    def __enter__(self):
        self.p = subprocess.Popen([os.path.join(REL, "mock-broker"), self.topic, str(self.partitions)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.bootstrap = self.p.stdout.readline().strip()
        return self

    def __exit__(self, *a):
        self.p.stdin.close()
        self.p.wait()


class Tansu:
    name = f"{os.path.basename(TANSU)} (sqlite)"

    def __init__(self, topic="maxwell", partitions=None):
        self.topic = topic
        self.partitions = partitions or PARTS

    def __enter__(self):
        self.dir = tempfile.mkdtemp(prefix="bench-tansu-")
        port = free_port()
        url = f"tcp://127.0.0.1:{port}"
        self.p = subprocess.Popen([TANSU, "broker", "--listener-url", url, "--advertised-listener-url", url,
                                   "--storage-engine", "sqlite://tansu.db"], cwd=self.dir,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  env=dict(os.environ, RUST_LOG="warn"))
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        subprocess.run([TANSU, "topic", "create", self.topic, "--broker", url, "--partitions", str(self.partitions)],
                       check=True, cwd=self.dir, capture_output=True)
        self.bootstrap = f"127.0.0.1:{port}"
        return self

    def __exit__(self, *a):
        self.p.kill()
        self.p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def median_of(results):
    """Median by rate of a list of (rate, ...) results, and the run it came from."""
    rates = [r[0] for r in results]
    m = statistics.median(rates)
    pick = results[rates.index(m)] if m in rates else results[0]
    return m, pick


def interleaved(cells):
    """Run every cell once per round, RUNS rounds, so that no system always
    runs first after the data was produced (Tansu is still busy then) or
    always last; median of each."""
    results = {k: [] for k in cells}
    errors = {}
    for i in range(RUNS):
        for k, fn in cells.items():
            if k in errors:
                continue
            try:
                results[k].append(fn(i))
            except Exception as e:  # recorded; the other cells go on
                errors[k] = str(e).splitlines()[0][:200]
    out = {k: median_of(v) for k, v in results.items() if v and k not in errors}
    return out, errors


def sluice(broker, plugin, sink, work, i, config=(), tag="", stages=None):
    """One Sluice run over the topic: (records/s, peak RSS MiB, sink db).

    sink: False (none), True (a fresh SQLite file), a function that
    prepares that file (creates its tables) first, or a sink database URL; config: `--config`
    pairs; tag: tells apart the checkpoints and files of cells that run
    one plugin with different configs; stages: a dict that gets the run's
    map and sink time in ms (`durations_ms` summed over its batches: the
    stages' own work, without the waits for the broker)."""
    name = f"{plugin}{tag}-{i}"
    ck = os.path.join(work, f"ck-{name}")
    args = [HOST, "run", "--brokers", broker.bootstrap, "--topic", "maxwell", "--checkpoint", ck,
            "--plugin", os.path.join(WASM, f"{plugin}.wasm"), "--until-caught-up", "--progress", "json",
            "--max-records-per-partition", "20000", "--trigger-interval", "10ms"]
    for kv in config:
        args += ["--config", kv]
    db = None
    if isinstance(sink, str):
        db = sink  # a sink database URL, ready
        args += ["--sink-db", sink]
    elif sink:
        db = os.path.join(work, f"sink-{name}.db")
        if callable(sink):
            sink(db)
        args += ["--sink-db", f"sqlite:{db}"]
    wall, rss, out = timed(args, env=dict(os.environ, RUST_LOG="warn"))
    batches = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    n = sum(b["counts"]["input"] for b in batches)
    if stages is not None:
        for k in ("map", "sink"):
            stages[k] = sum(b["durations_ms"][k] for b in batches)
    if n != EVENTS:
        raise RuntimeError(f"sluice read {n} records, expected {EVENTS}")
    return EVENTS / wall, rss, db


def run_broker(broker_cls, rows, work):
    work = os.path.join(work, broker_cls.__name__.lower())
    os.makedirs(work, exist_ok=True)
    with broker_cls() as b:
        expected_file = os.path.join(work, "expected.json")
        subprocess.run([os.path.join(REL, "produce"), b.bootstrap, "maxwell", str(PARTS), str(EVENTS), expected_file],
                       check=True)
        expected = json.load(open(expected_file))
        res = {}

        def bare(i):
            wall, rss, out = timed([os.path.join(REL, "bare-consumer"), b.bootstrap, "maxwell"])
            n, _ = out.split()
            if int(n) != EVENTS:
                raise RuntimeError(f"bare consumer read {n}")
            return EVENTS / wall, rss

        def company(i):
            rate, rss, db = sluice(b, "company", True, work, i)
            return rate, rss, table_of(db) == expected

        def py(i):
            db = os.path.join(work, f"py-{i}.db")
            wall, rss, _ = timed([PY, os.path.join(ROOT, "bench", "py_consumer.py"), b.bootstrap, "maxwell", db, "1000"])
            return EVENTS / wall, rss, table_of(db) == expected

        def quix(i):
            db = os.path.join(work, f"quix-{i}.db")
            wall, rss, _ = timed([PY, os.path.join(ROOT, "bench", "quix_consumer.py"), b.bootstrap, "maxwell", db, str(EVENTS)])
            return EVENTS / wall, rss, table_of(db) == expected

        cells = {
            "ceiling": bare,
            "passthrough": lambda i: sluice(b, "passthrough", False, work, i),
            "company": company,
        }
        if not os.environ.get("SKIP_PYTHON"):
            cells["python"] = py
        if broker_cls is Tansu and not os.environ.get("SKIP_QUIX"):
            cells["quix"] = quix
        bare(-1)  # warm-up, not counted: the broker may still be settling after the produce
        res, errors = interleaved(cells)
        for k in ("ceiling", "passthrough", "company", "python"):
            if k in errors:
                raise RuntimeError(f"{k}: {errors[k]}")
        if "quix" in errors:  # reported, not fatal
            res["quix_error"] = errors["quix"]
        rows[b.name] = res


def recovery(work):
    """Restart on a 100-batch checkpoint, takeover gap, swap latency (mock)."""
    out = {}
    with Mock() as b:
        subprocess.run([os.path.join(REL, "produce"), b.bootstrap, "maxwell", str(PARTS), "12000",
                        os.path.join(work, "rexp.json")], check=True)
        ck = os.path.join(work, "ck-recovery")
        db = os.path.join(work, "recovery.db")
        base = [HOST, "run", "--brokers", b.bootstrap, "--topic", "maxwell", "--checkpoint", ck,
                "--sink-db", f"sqlite:{db}", "--trigger-interval", "10ms"]
        plugin = ["--plugin", os.path.join(WASM, "company.wasm")]
        subprocess.run(base + plugin + ["--until-caught-up", "--max-records-per-partition", "20", "--progress", "none"],
                       check=True, capture_output=True, env=dict(os.environ, RUST_LOG="warn"))
        batches = len(os.listdir(os.path.join(ck, "commits")))
        subprocess.run([os.path.join(REL, "produce"), b.bootstrap, "maxwell", str(PARTS), "600",
                        os.path.join(work, "rexp2.json")], check=True)
        t0 = time.time()
        p = subprocess.Popen(base + ["--progress", "json"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True, env=dict(os.environ, RUST_LOG="warn"))
        p.stdout.readline()
        out["restart_to_first_commit_ms"] = (time.time() - t0) * 1000
        out["restart_checkpoint_batches"] = batches
        # Swap: request -> answer (effective at the next batch boundary).
        t0 = time.time()
        s = subprocess.run([HOST, "swap", "--checkpoint", ck, "--plugin", os.path.join(WASM, "company.wasm")],
                           capture_output=True, text=True)
        out["swap_request_to_effective_ms"] = (time.time() - t0) * 1000
        out["swap_answer"] = s.stdout.strip() or s.stderr.strip()[-200:]
        # Takeover gap as measured by the new owner.
        n = subprocess.Popen(base + ["--takeover", "60s", "--progress", "none"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, env=dict(os.environ, RUST_LOG="info"))
        gap = None
        for line in n.stderr:
            if "gap from the old owner" in line:
                gap = float(line.rsplit(":", 1)[1].strip().split()[0])
                break
        out["takeover_gap_ms"] = gap
        try:
            p.wait(timeout=90)
        finally:
            p.kill()
            n.terminate()
            n.wait(timeout=60)
    return out


def main():
    work = tempfile.mkdtemp(prefix="sluice-bench-")
    rows = {}
    try:
        run_broker(Mock, rows, work)
        run_broker(Tansu, rows, work)
        try:
            rec = recovery(work)
        except Exception as e:  # reported, the table still prints
            rec = {"error": str(e).splitlines()[0][:300]}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    lines = [f"{EVENTS} Maxwell events (~200 bytes) over {PARTS} partitions; medians of {RUNS} runs; rec/s = events / wall time of the whole process.",
             "",
             "| broker | system | rec/s | peak RSS MiB | final table correct (byte-exact) | ratio |",
             "|---|---|---:|---:|---|---|"]
    for broker, r in rows.items():
        ceil = r["ceiling"][0]
        def row(label, key, ratio_to=None, ratio_label=""):
            if key not in r:
                return
            rate, pick = r[key]
            rss = pick[1]
            ok = {True: "yes", False: "no"}.get(pick[2], "-") if len(pick) > 2 and isinstance(pick[2], bool) else "-"
            ratio = f"{rate / ratio_to:.2f}x {ratio_label}" if ratio_to else ""
            lines.append(f"| {broker} | {label} | {rate:,.0f} | {rss:.0f} | {ok} | {ratio} |")
        row("(1) bare rdkafka consumer (ceiling)", "ceiling")
        row("(2) Sluice passthrough, discard sink", "passthrough", ceil, "of (1)")
        row("(3) Sluice company -> SQLite, exactly once", "company", ceil, "of (1)")
        if "python" in r:
            row("(4a) Python confluent-kafka + sqlite3, commit every 1000", "python")
            lines.append(f"| {broker} | (3) / (4a) | | | | {r['company'][0] / r['python'][0]:.2f}x |")
        if "quix" in r:
            row("(4b) Quix Streams + sqlite3", "quix")
        if "quix_error" in r:
            lines.append(f"| {broker} | (4b) Quix Streams | failed: {r['quix_error']} | | | |")
    lines += ["", "Recovery and upgrade (mock cluster):", ""]
    for k, v in rec.items():
        lines.append(f"- {k}: {v if not isinstance(v, float) else round(v, 1)}")
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(ROOT, "bench", "results.md"), "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
