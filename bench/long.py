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
  same upserts (bench/py_consumer.py);
- python executemany -> SQLite: the faster consumer users write, each
  key's last change per 2,000 records written with `executemany`
  (bench/py_batch_consumer.py; psycopg 3 pipelines it on PostgreSQL);
- Bytewax -> SQLite: the same work as a Bytewax dataflow
  (bench/bytewax_flow.py), the peer a data engineer would pick instead;
- with BENCH_PG_URL (a PostgreSQL server; bench/long.sh starts one):
  company -> PostgreSQL, python -> PostgreSQL and python executemany ->
  PostgreSQL, each into a fresh database per run, and PostgreSQL's own
  bulk path as a ceiling (bench/pg_bulk_ceiling.py: binary COPY into a
  staging table and one merge per 128,000 changes; its rate counts the
  database work only, the topic is read before the clock starts).

For the PostgreSQL rows the server's CPU is measured too (every
`postgres` process's user + system time from /proc, exited backends
through the postmaster's children times; every cluster on the machine
counts, so run it with no other PostgreSQL busy) while each system's
process runs (not the table checks after): CPU seconds per million
records on the client's side and on the server's.

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
records a batch at 64 partitions), SKIP_PYTHON=1, SKIP_PYTHON_PG=1 (only the python -> PostgreSQL row), SKIP_BYTEWAX=1,
SKIP_BATCH_PYTHON=1 (the executemany rows), ONLY_PG=1 (just the PostgreSQL rows),
BASELINE_COMPANY_WASM=PATH (another build of the company component, run beside this one into PostgreSQL),
BASELINE_HOST=PATH (another host binary, run beside this one into PostgreSQL, with each SINK_CONNECTIONS value),
BENCH_COMPANIES (company ids the events cycle through, default 5,000; 1000000 makes every event a new key),
SINK_CONNECTIONS=1,2,4 (one company -> PostgreSQL row per --sink-connections value instead of the default's),
BENCH_PG_URL. Needs psycopg (in the bench venv) for the PostgreSQL rows.
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


def measure_pg(cmd):
    """measure(cmd) and the PostgreSQL server's CPU seconds during it
    only (not the table checks after)."""
    before = pg_server_cpu()
    wall, cpu, rss, out = measure(cmd)
    return wall, cpu, rss, out, pg_server_cpu() - before


def steady(progress):
    """Records/s between the first batch's commit and the last-but-one's,
    over the batches in between; None with fewer than three batches."""
    if len(progress) < 3:
        return None
    at = [datetime.datetime.fromisoformat(b["committed_at"].replace("Z", "+00:00")) for b in progress]
    seconds = (at[-2] - at[0]).total_seconds()
    records = sum(b["counts"]["input"] for b in progress[1:-1])
    return records / seconds if seconds > 0 else None


PG_URL = os.environ.get("BENCH_PG_URL")


def pg_server_cpu():
    """CPU seconds (user + system) the local PostgreSQL server has used:
    every `postgres` process's own times plus its reaped children's (a
    backend that exited is counted in the postmaster's)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        if name == "postgres":
            # Fields 14-17 of proc(5): utime stime cutime cstime (rest[0] is field 3).
            total += sum(int(x) for x in rest[11:15])
    return total / ticks


def fresh_pg(name):
    """A new, empty database `name` on BENCH_PG_URL's server; its URL."""
    import psycopg
    with psycopg.connect(PG_URL, autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {name}")
        c.execute(f"CREATE DATABASE {name}")
    return PG_URL.rsplit("/", 1)[0] + "/" + name


def pg_table_of(url):
    import psycopg
    with psycopg.connect(url) as c:
        return dict(c.execute("SELECT pk, row_json FROM companies").fetchall())


def main():
    with tempfile.TemporaryDirectory(prefix="bench-long-") as work, run.Mock(partitions=PARTS) as b:
        expected_file = os.path.join(work, "expected.json")
        subprocess.run([os.path.join(run.REL, "produce"), b.bootstrap, "maxwell", str(PARTS), str(EVENTS),
                        expected_file], check=True, capture_output=True)
        with open(expected_file) as f:
            expected = json.load(f)

        def sluice(plugin, sink, i, wasm=None, connections=None, host=None):
            ck = os.path.join(work, f"ck-{plugin}-{sink}-{i}-{bool(wasm)}-{connections}-{bool(host)}")
            args = [host or run.HOST, "run", "--brokers", b.bootstrap, "--topic", "maxwell", "--checkpoint", ck,
                    "--plugin", wasm or os.path.join(run.WASM, f"{plugin}.wasm"), "--until-caught-up",
                    "--progress", "json", "--max-records-per-partition", BATCH, "--trigger-interval", "10ms"]
            db = None
            if sink == "sqlite":
                db = os.path.join(work, f"sink-{plugin}-{i}.db")
                args += ["--sink-db", f"sqlite:{db}"]
            elif sink == "postgres":
                db = fresh_pg(f"bench_sluice_{i}")
                args += ["--sink-db", db]
                if connections:
                    args += ["--sink-connections", connections]
            wall, cpu, rss, out, server = measure_pg(args)
            progress = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
            n = sum(p["counts"]["input"] for p in progress)
            if n != EVENTS:
                raise RuntimeError(f"sluice read {n} records, expected {EVENTS}")
            table = None if db is None else pg_table_of(db) if sink == "postgres" else run.table_of(db)
            if db and table != expected:
                raise RuntimeError(f"company's table in {sink} differs from the expected one")
            return {"wall": wall, "cpu": cpu, "rss": rss, "steady": steady(progress), "batches": len(progress),
                    "exact": True if db else None, **({"server_cpu": server} if sink == "postgres" else {})}

        def bare(i):
            wall, cpu, rss, out = measure([os.path.join(run.REL, "bare-consumer"), b.bootstrap, "maxwell"])
            if int(out.split()[0]) != EVENTS:
                raise RuntimeError(f"bare consumer read {out.split()[0]}")
            return {"wall": wall, "cpu": cpu, "rss": rss, "steady": None, "batches": None, "exact": None}

        def checked(name, table):
            # json.loads/dumps round decimals such as 999999001038.998123
            # through float, so Python's rows are not byte-exact; they must
            # still hold every primary key.
            if table.keys() != expected.keys():
                raise RuntimeError(f"{name}'s table has other primary keys than the expected one")
            return table == expected

        def python(sink, i, script="py_consumer.py", every="1000"):
            tag = script.split(".")[0]
            db = fresh_pg(f"bench_{tag}_{i}") if sink == "postgres" else os.path.join(work, f"{tag}-{i}.db")
            wall, cpu, rss, _, server = measure_pg([run.PY, os.path.join(run.ROOT, "bench", script), b.bootstrap,
                                                    "maxwell", db, every])
            table = pg_table_of(db) if sink == "postgres" else run.table_of(db)
            return {"wall": wall, "cpu": cpu, "rss": rss, "steady": None, "batches": None,
                    "exact": checked(tag, table), **({"server_cpu": server} if sink == "postgres" else {})}

        def ceiling_pg(i):
            db = fresh_pg(f"bench_bulk_{i}")
            _, cpu, rss, out, server = measure_pg([run.PY, os.path.join(run.ROOT, "bench", "pg_bulk_ceiling.py"),
                                                   b.bootstrap, "maxwell", db, str(int(BATCH) * PARTS)])
            seconds = float(out.split()[0])
            return {"wall": seconds, "cpu": cpu, "rss": rss, "steady": None, "batches": None,
                    "exact": checked("bulk ceiling", pg_table_of(db)), "server_cpu": server}

        def bytewax(i):
            db = os.path.join(work, f"bytewax-{i}.db")
            os.environ.update(BENCH_BROKERS=b.bootstrap, BENCH_TOPIC="maxwell", BENCH_DB=db)
            wall, cpu, rss, _ = measure([run.PY, "-m", "bytewax.run",
                                         os.path.join(run.ROOT, "bench", "bytewax_flow.py") + ":flow"])
            return {"wall": wall, "cpu": cpu, "rss": rss, "steady": None, "batches": None,
                    "exact": checked("bytewax", run.table_of(db))}

        env = os.environ.get
        batch_py = lambda sink: lambda i: python(sink, i, "py_batch_consumer.py", "2000")  # noqa: E731
        cells = {}
        if not env("ONLY_PG"):
            cells["ceiling (bare librdkafka consumer)"] = bare
            cells["Sluice passthrough"] = lambda i: sluice("passthrough", None, i)
            cells["Sluice company -> SQLite"] = lambda i: sluice("company", "sqlite", i)
            if not env("SKIP_PYTHON"):
                cells["python consumer -> SQLite"] = lambda i: python("sqlite", i)
            if not env("SKIP_BATCH_PYTHON"):
                cells["python executemany consumer -> SQLite"] = batch_py("sqlite")
            if not env("SKIP_BYTEWAX"):
                cells["Bytewax -> SQLite"] = bytewax
        if PG_URL:
            if env("BASELINE_COMPANY_WASM"):
                cells["Sluice company, baseline build -> PostgreSQL"] = lambda i: sluice(
                    "company", "postgres", i, env("BASELINE_COMPANY_WASM"))
            connections = [c for c in env("SINK_CONNECTIONS", "").split(",") if c]
            if env("BASELINE_HOST"):
                for c in connections or [None]:
                    name = "Sluice company, baseline host -> PostgreSQL" + (f", --sink-connections {c}" if c else "")
                    cells[name] = lambda i, c=c: sluice("company", "postgres", i, connections=c,
                                                        host=env("BASELINE_HOST"))
            for c in connections:
                cells[f"Sluice company -> PostgreSQL, --sink-connections {c}"] = \
                    lambda i, c=c: sluice("company", "postgres", i, connections=c)
            if not connections:
                cells["Sluice company -> PostgreSQL"] = lambda i: sluice("company", "postgres", i)
            if not (env("SKIP_PYTHON") or env("SKIP_PYTHON_PG")):
                cells["python consumer -> PostgreSQL"] = lambda i: python("postgres", i)
            if not env("SKIP_BATCH_PYTHON"):
                cells["python executemany consumer -> PostgreSQL"] = batch_py("postgres")
            cells["PostgreSQL bulk path (COPY + merge), database work only: ceiling"] = ceiling_pg
        results = {k: [] for k in cells}
        for i in range(run.RUNS):
            for k, fn in cells.items():
                results[k].append(fn(i))

    med = lambda k, f: statistics.median(r[f] for r in results[k])  # noqa: E731
    print(f"{EVENTS:,} Maxwell events, {PARTS} partitions, mock cluster, Sluice batches of "
          f"--max-records-per-partition {BATCH}, median of {run.RUNS} interleaved runs\n")
    print("| system | records/s (whole process) | records/s (steady state) | CPU s per 1M records "
          "| server CPU s per 1M | peak RSS MiB | batches | table byte-exact |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for k in cells:
        rate = EVENTS / med(k, "wall")
        steadies = [r["steady"] for r in results[k] if r["steady"]]
        st = f"{statistics.median(steadies):,.0f}" if steadies else "n/a"
        cpu = med(k, "cpu") * 1e6 / EVENTS
        batches = results[k][0]["batches"]
        exact = {True: "yes", False: "no", None: ""}[all(r["exact"] for r in results[k])
                                                     if results[k][0]["exact"] is not None else None]
        server = (f"{statistics.median(r['server_cpu'] for r in results[k]) * 1e6 / EVENTS:.2f}"
                  if "server_cpu" in results[k][0] else "")
        print(f"| {k} | {rate:,.0f} | {st} | {cpu:.2f} | {server} | {med(k, 'rss'):.0f} | "
              f"{batches if batches is not None else ''} | {exact} |")


if __name__ == "__main__":
    main()
