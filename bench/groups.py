#!/usr/bin/env python3
"""Pipeline groups (`host run --group`): throughput with 1, 2 and 3 members
next to the same pipeline without --group, and the hand-over gap when a
member is stopped (SIGTERM) or killed (SIGKILL), next to the same broker's
own figure for two plain rdkafka consumers in one group.

Throughput: the `company` plugin (PLUGIN) into SQLite and PostgreSQL; the
records applied are read from the progress rows. Hand-overs: the
`sql-counter` fixture into SQLite (one UPDATE of one shared row and one
INSERT per record, in the part's transaction). Broker: librdkafka's mock cluster as its own process,
and Tansu (sqlite storage) unless SKIP_TANSU=1.

- throughput: EVENTS records produced first; time from starting the
  processes until the counter shows all of them ("total", start-up and
  group join included), and the rate between 10 % and 100 % applied
  ("steady").
- gap: two members (or two plain consumers), records arriving at RATE/s;
  one is stopped; the gap is from the signal to the moment the other has
  committed (Sluice: a progress row written by it; plain consumers: the
  first record read) on every partition the stopped one held; the worst
  partition counts. session.timeout.ms is 6000 everywhere.

Throughput also on PostgreSQL when BENCH_PG_URL is set (a database per
cell is created there; PSQL names the psql binary). Run with `bash
bench/groups.sh` (it starts a throwaway PostgreSQL with scripts/pg.sh).
Environment: RUNS (default 3), EVENTS (default 120000), PARTITIONS
(default 12), RATE (default 2000), SKIP_TANSU=1, SKIP_GAPS=1. Host logs go to a temp
directory (named on failure).
"""
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (the side-by-side benchmark: its brokers)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REL = os.path.join(ROOT, "target", "release")
HOST = os.environ.get("SLUICE_HOST", os.path.join(REL, "host"))
# The throughput cells run PLUGIN (default `company`: Maxwell events mapped
# and upserted by primary key, one row per company), the hand-over cells
# `sql-counter` (one shared counter row, so nothing counted twice can hide).
PLUGIN = os.environ.get("PLUGIN", "company")
WASM = os.path.join(ROOT, "target", "wasm32-wasip2", "release")
COUNTER = os.path.join(WASM, "sql_counter.wasm")
RUNS = int(os.environ.get("RUNS", "3"))
# librdkafka's mock cluster keeps about 15,000 records per partition and
# moves the log start past older ones, so keep EVENTS / PARTITIONS below
# that.
EVENTS = int(os.environ.get("EVENTS", "120000"))
RATE = int(os.environ.get("RATE", "2000"))
PARTS = int(os.environ.get("PARTITIONS", "12"))
SESSION = "6000"
LOGS = tempfile.mkdtemp(prefix="bench-groups-logs-")


class Mock(run.Mock):
    def __init__(self, topic):
        super().__init__(topic, PARTS)


class Tansu(run.Tansu):
    name = "Tansu 0.6.0 (sqlite)"

    def __init__(self, topic):
        super().__init__(topic, PARTS)


def counted(db):
    try:
        c = sqlite3.connect(db, timeout=5)
        try:
            row = c.execute("SELECT n FROM counters WHERE name = 'records'").fetchone()
            return row[0] if row else 0
        finally:
            c.close()
    except sqlite3.Error:
        return 0


def query(db, sql, args=()):
    try:
        c = sqlite3.connect(db, timeout=5)
        try:
            return c.execute(sql, args).fetchall()
        finally:
            c.close()
    except sqlite3.Error:
        return []


def applied_sql():
    return "SELECT COALESCE(SUM(end_offset), 0) FROM sluice_progress"


class Postgres:
    """A database per cell on the PostgreSQL server at BENCH_PG_URL
    (`postgres://USER@HOST:PORT/postgres`), read with `psql` (PSQL)."""

    def __init__(self, name):
        base = os.environ["BENCH_PG_URL"].rsplit("/", 1)[0]
        self.url = f"{base}/{name}"
        self.admin = os.environ["BENCH_PG_URL"]
        psql(self.admin, f"DROP DATABASE IF EXISTS {name}")
        psql(self.admin, f"CREATE DATABASE {name}")

    def count(self):
        """Offsets applied (the progress rows; every partition starts at 0)."""
        out = psql(self.url, applied_sql(), check=False)
        return int(out) if out.strip().isdigit() else 0


def psql(url, sql, check=True):
    out = subprocess.run([os.environ.get("PSQL", "psql"), "-tAq", "-d", url, "-c", sql], capture_output=True,
                         text=True)
    if check and out.returncode != 0:
        raise RuntimeError(f"psql: {out.stderr}")
    return out.stdout.strip()


class Sqlite:
    def __init__(self, path):
        self.path = path
        self.url = f"sqlite:{path}"

    def count(self):
        """Offsets applied (the progress rows; every partition starts at 0)."""
        rows = query(self.path, applied_sql())
        return rows[0][0] if rows else 0


def member(broker, db, group=None, ckpt=None, plugin=COUNTER):
    url = db.url if hasattr(db, "url") else f"sqlite:{db}"
    args = [HOST, "run", "--brokers", broker.bootstrap, "--topic", broker.topic, "--plugin", plugin,
            "--sink-db", url, "--max-records-per-partition", "20000", "--trigger-interval", "10ms",
            "--progress", "none", "--config", f"kafka.session.timeout.ms={SESSION}",
            "--config", "kafka.heartbeat.interval.ms=500"]
    args += ["--group", group] if group else ["--checkpoint", ckpt]
    # The log goes to a file: a pipe nobody reads would block the host.
    log = open(os.path.join(LOGS, f"host-{group or 'local'}-{time.time_ns()}.log"), "w")
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log, text=True,
                            env=dict(os.environ, RUST_LOG="warn"))


def stop_all(procs):
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()


def throughput(broker, work, sink, members, i):
    """(total rate, steady rate) for `members` group members (0: no --group)
    on `sink` ("sqlite" or "postgres")."""
    name = f"tp_{members}_{i}"
    plugin = os.path.join(WASM, f"{PLUGIN.replace('-', '_')}.wasm")
    db = Sqlite(os.path.join(work, f"{name}.db")) if sink == "sqlite" else Postgres(name)
    t0 = time.perf_counter()
    if members == 0:
        procs = [member(broker, db, ckpt=os.path.join(work, f"ck-{sink}-{i}"), plugin=plugin)]
    else:
        procs = [member(broker, db, group=f"tp{members}-{i}", plugin=plugin) for _ in range(members)]
    t10 = None
    try:
        while True:
            n = db.count()
            if t10 is None and n >= EVENTS // 10:
                t10 = time.perf_counter()
            if n >= EVENTS:
                break
            if time.perf_counter() - t0 > 600:
                raise RuntimeError(f"{members} member(s): {n} of {EVENTS} after 600 s")
            for p in procs:
                if p.poll() is not None:
                    raise RuntimeError(f"a host exited {p.returncode}; logs in {LOGS}")
            time.sleep(0.02)
        t100 = time.perf_counter()
    finally:
        stop_all(procs)
    if n != EVENTS:
        raise RuntimeError(f"counted {n}, produced {EVENTS}")
    return EVENTS / (t100 - t0), (EVENTS - EVENTS // 10) / (t100 - t10)


class Load:
    """Records at RATE per second to the topic, from `produce --lines -`."""

    def __init__(self, broker):
        self.p = subprocess.Popen([os.path.join(REL, "produce"), broker.bootstrap, broker.topic, "--lines", "-"],
                                  stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  text=True)
        self.running = True
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        n = 0
        start = time.perf_counter()
        while self.running:
            due = int((time.perf_counter() - start) * RATE)
            while n < due:
                self.p.stdin.write(f"r{n}\n")
                n += 1
            self.p.stdin.flush()
            time.sleep(0.01)

    def stop(self):
        self.running = False
        self.t.join()
        self.p.stdin.close()
        self.p.wait(60)


def now_ms():
    return int(time.time() * 1000)


def sluice_gap(broker, work, how, i):
    """ms from SIGTERM/SIGKILL of one of two members to the other's first
    commit on each of the stopped member's partitions (the worst one)."""
    db = os.path.join(work, f"gap-{how}-{i}.db")
    group = f"gap-{how}-{i}"
    load = Load(broker)
    a = member(broker, db, group=group)
    b = member(broker, db, group=group)
    try:
        deadline = time.time() + 120
        while True:
            owners = query(db, "SELECT owner, count(*) FROM sluice_partitions WHERE group_name = ? GROUP BY owner",
                           (group,))
            if len(owners) == 2 and sum(c for _, c in owners) == PARTS and counted(db) > 0:
                break
            if time.time() > deadline:
                raise RuntimeError(f"the two members did not split the partitions: {owners}")
            time.sleep(0.1)
        time.sleep(3)
        mine = [p for (p,) in query(db, "SELECT \"partition\" FROM sluice_partitions WHERE group_name = ? "
                                        "AND owner LIKE ?", (group, f"pid {a.pid} %"))]
        t0 = now_ms()
        a.terminate() if how == "term" else a.kill()
        first = {}
        while len(first) < len(mine):
            for p, at, owner in query(db, "SELECT \"partition\", updated_at_ms, owner FROM sluice_progress "
                                          "WHERE query_id = ?", (group,)):
                if p in mine and p not in first and at > t0 and owner.startswith(f"pid {b.pid} "):
                    first[p] = at
            if now_ms() - t0 > 120_000:
                raise RuntimeError(f"b took over {sorted(first)} of {mine} within 120 s")
            time.sleep(0.02)
        return max(first.values()) - t0
    finally:
        stop_all([a, b])
        load.stop()


def plain_gap(broker, how, i):
    """The same for two plain consumers: ms to the other's first record on
    each of the stopped consumer's partitions."""
    group = f"plain-{how}-{i}"
    load = Load(broker)

    def consumer():
        p = subprocess.Popen([os.path.join(REL, "group-consumer"), broker.bootstrap, broker.topic, group, SESSION],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        p.lines = []
        threading.Thread(target=lambda: [p.lines.append(json.loads(l)) for l in p.stdout], daemon=True).start()
        return p

    a, b = consumer(), consumer()
    try:
        deadline = time.time() + 120
        while True:
            pa = {l["partition"] for l in a.lines}
            pb = {l["partition"] for l in b.lines}
            if pa and pb and len(pa | pb) == PARTS and not pa & pb:
                break
            if time.time() > deadline:
                raise RuntimeError(f"the two consumers did not split the partitions: {pa} {pb}")
            time.sleep(0.1)
        time.sleep(3)
        mine = {l["partition"] for l in a.lines}
        t0 = now_ms()
        if how == "term":
            a.stdin.close()
        else:
            a.kill()
        while True:
            got = {l["partition"]: l["first_ms"] for l in b.lines if l["first_ms"] > t0}
            if mine <= got.keys():
                return max(got[p] for p in mine) - t0
            if now_ms() - t0 > 120_000:
                raise RuntimeError(f"b took over {sorted(got)} of {sorted(mine)} within 120 s")
            time.sleep(0.02)
    finally:
        for p in (a, b):
            if p.poll() is None:
                if not p.stdin.closed:
                    p.stdin.close()
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
        load.stop()


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    brokers = [Mock] + ([] if os.environ.get("SKIP_TANSU") else [Tansu])
    sinks = ["sqlite"] + (["postgres"] if os.environ.get("BENCH_PG_URL") else [])
    lines = [f"Pipeline groups, {RUNS} runs (median), {os.cpu_count()} cores, {EVENTS} records; "
             f"throughput: {PLUGIN}, hand-overs: sql-counter", "", "| broker | sink | what | total rec/s | steady rec/s | vs without --group |",
             "|---|---|---|---:|---:|---:|"]
    gaps = ["", f"Hand-over gap (ms; records arriving at {RATE}/s, session.timeout.ms {SESSION})", "",
            "| broker | how | Sluice members | plain rdkafka consumers |", "|---|---|---:|---:|"]
    for kind in brokers:
        with tempfile.TemporaryDirectory(prefix="bench-groups-") as work:
            with kind("events") as broker:
                subprocess.run([os.path.join(REL, "produce"), broker.bootstrap, "events", str(PARTS), str(EVENTS),
                                os.path.join(work, "expected.json")], check=True)
                for sink in sinks:
                    results = {m: [] for m in (0, 1, 2, 3)}
                    for i in range(RUNS):
                        for m in results:
                            results[m].append(throughput(broker, work, sink, m, i))
                            print(f"{broker.name} {sink}: {m} member(s), run {i}: {results[m][-1]}",
                                  file=sys.stderr)
                    base = median([s for _, s in results[0]])
                    for m, rs in results.items():
                        label = "without --group (checkpoint directory)" if m == 0 else f"--group, {m} member(s)"
                        steady = median([s for _, s in rs])
                        lines.append(f"| {broker.name} | {sink} | {label} | {median([t for t, _ in rs]):,.0f} | "
                                     f"{steady:,.0f} | {steady / base:.2f}x |")
            for how in () if os.environ.get("SKIP_GAPS") else ("term", "kill"):
                s, p = [], []
                for i in range(RUNS):
                    with kind("events") as broker:
                        s.append(sluice_gap(broker, work, how, i))
                    with kind("events") as broker:
                        p.append(plain_gap(broker, how, i))
                    print(f"{kind.name}: {how}, run {i}: sluice {s[-1]} ms, plain {p[-1]} ms", file=sys.stderr)
                label = "SIGTERM (leave)" if how == "term" else "SIGKILL (session timeout)"
                gaps.append(f"| {kind.name} | {label} | {median(s):,.0f} | {median(p):,.0f} |")
    print("\n".join(lines + gaps))


if __name__ == "__main__":
    main()
