#!/usr/bin/env python3
"""The cdc plugin against the company plugin on the same input.

Maxwell company events (inserts, updates, one delete in 50; the events
of bench/run.py) on the mock cluster, each pipeline into a fresh SQLite
file (or a fresh PostgreSQL database), `--until-caught-up`: company (one
JSON row per company, one statement per record) and cdc with several
`batch_rows` (1: one statement per change; more: multi-row statements).
Each cdc table is checked cell by cell against the producer's expected
final state. The median of RUNS interleaved runs; prints a markdown table.

Run with `bash bench/cdc.sh` (builds in release mode first). Environment:
RUNS (default 3), EVENTS (default 60000), PARTITIONS (default 6),
BASELINE_WASM (another build of the cdc component, e.g. one made from an
earlier commit with `git worktree`: run with the default settings next to
this one, for an A/B of a change; CELLS=default then runs just the two
cdc defaults), PG_URL
(a PostgreSQL server's admin URL, e.g. `postgres://postgres@127.0.0.1:5432/postgres`:
the sinks are fresh databases there instead of SQLite files; `source
scripts/pg.sh && pg_start` starts a throwaway server and sets
SLUICE_TEST_PG_URL).
"""
import decimal
import itertools
import json
import os
import shutil
import statistics
import sqlite3
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (the shared brokers, timing and medians)

PG_URL = os.environ.get("PG_URL")

CDC_TABLE = {
    "sqlite": ("CREATE TABLE company (id INTEGER PRIMARY KEY, name TEXT NOT NULL, valuation TEXT, "
               "founded DATETIME, _sluice_position TEXT)"),
    "postgres": ("CREATE TABLE company (id BIGINT PRIMARY KEY, name TEXT NOT NULL, valuation NUMERIC(30,6), "
                 "founded DATE, _sluice_position TEXT)"),
}


def psql(url, sql):
    """Run `sql` with psql; its output rows as lists of text (`\\N` = NULL)."""
    out = subprocess.run(["psql", "-X", "-q", "-A", "-t", "-F", "\t", "-P", "null=\\N", "-v", "ON_ERROR_STOP=1",
                          url, "-c", sql], check=True, capture_output=True, text=True).stdout
    return [line.split("\t") for line in out.splitlines() if line]


SEQ = itertools.count()


def sink_for(plugin):
    """What run.sluice takes as the sink of one run: for PostgreSQL a fresh
    database's URL (with the cdc table), for SQLite a function that
    creates the cdc table in the fresh file (True for company)."""
    if PG_URL:
        name = f"bench_cdc_{os.getpid()}_{next(SEQ)}"
        psql(PG_URL, f"CREATE DATABASE {name}")
        url = PG_URL.rsplit("/", 1)[0] + "/" + name
        if plugin.startswith("cdc"):
            psql(url, CDC_TABLE["postgres"])
        return url
    if not plugin.startswith("cdc"):
        return True

    def create(db):
        c = sqlite3.connect(db)
        c.execute(CDC_TABLE["sqlite"])
        c.commit()
        c.close()
    return create


def check_cdc(db, expected):
    """The cdc table equals the expected final rows, cell by cell
    (decimals compared as numbers: NUMERIC shows its scale)."""
    query = "SELECT id, name, valuation, founded FROM company"
    if PG_URL:
        rows = [(int(i), n, v, None if f == "\\N" else f) for i, n, v, f in psql(db, query)]
    else:
        c = sqlite3.connect(db)
        rows = list(c.execute(query))
        c.close()
    got = {r[0]: (r[1], decimal.Decimal(r[2]), r[3]) for r in rows}
    want = {}
    for row in expected.values():
        r = json.loads(row, parse_float=str)  # the decimal's exact text
        # Maxwell's zero date becomes NULL (zero_dates=null, the default).
        want[r["id"]] = (r["name"], decimal.Decimal(r["valuation"]), None)
    if got != want:
        missing = len(set(want) - set(got))
        extra = len(set(got) - set(want))
        wrong = sum(1 for k in set(got) & set(want) if got[k] != want[k])
        raise RuntimeError(f"cdc table differs: {missing} missing, {extra} extra, {wrong} wrong rows")


def main():
    cells = {
        "company (one statement per record)": ("company", []),
        "cdc, batch_rows=1": ("cdc", ["route=shop.company=company", "batch_rows=1"]),
        "cdc, batch_rows=10": ("cdc", ["route=shop.company=company", "batch_rows=10"]),
        "cdc, batch_rows=100": ("cdc", ["route=shop.company=company", "batch_rows=100"]),
        "cdc, batch_rows=1000 (default)": ("cdc", ["route=shop.company=company"]),
        "cdc, batch_rows=5000": ("cdc", ["route=shop.company=company", "batch_rows=5000"]),
    }
    baseline = os.environ.get("BASELINE_WASM")
    if baseline:
        shutil.copyfile(baseline, os.path.join(run.WASM, "cdc-baseline.wasm"))
        cells["cdc baseline (BASELINE_WASM), batch_rows=1000"] = (
            "cdc-baseline", ["route=shop.company=company"])
    if os.environ.get("CELLS") == "default":
        cells = {k: v for k, v in cells.items() if "1000" in k}
    with tempfile.TemporaryDirectory(prefix="bench-cdc-") as work, run.Mock() as broker:
        expected_file = os.path.join(work, "expected.json")
        subprocess.run([os.path.join(run.REL, "produce"), broker.bootstrap, "maxwell", str(run.PARTS),
                        str(run.EVENTS), expected_file], check=True, capture_output=True)
        with open(expected_file) as f:
            expected = json.load(f)

        runs = {}

        def cell(n, name, plugin, config):
            def go(i):
                sink = sink_for(plugin)
                stages = {}
                rate, rss, db = run.sluice(broker, plugin, sink, work, i, config, tag=f"-{n}",
                                           stages=stages)
                if plugin.startswith("cdc"):
                    check_cdc(db, expected)
                runs.setdefault(name, []).append((rate, rss, stages))
                return rate, rss, stages
            return go

        results, errors = run.interleaved({k: cell(n, k, *v) for n, (k, v) in enumerate(cells.items())})
    base = results.get("company (one statement per record)", (None,))[0]
    print(f"{run.EVENTS} Maxwell events, {run.PARTS} partitions, mock cluster, "
          f"{'PostgreSQL' if PG_URL else 'SQLite'} sink, "
          f"median of {run.RUNS} interleaved runs\n")
    print("records/s and peak RSS: the median run by rate (wall time, so a fetch that waits on the "
          "broker counts); map and sink: µs per event of the stages' own work, median over all runs.\n")
    print("| pipeline | records/s | vs company | map µs/event | sink µs/event | peak RSS MiB |")
    print("|---|---:|---:|---:|---:|---:|")
    for k in cells:
        if k in errors:
            print(f"| {k} | failed: {errors[k]} | | | | |")
            continue
        rate, (_, rss, _) = results[k]
        us = {s: statistics.median(r[2][s] for r in runs[k]) * 1000 / run.EVENTS for s in ("map", "sink")}
        ratio = f"{rate / base:.2f}x" if base else ""
        print(f"| {k} | {rate:,.0f} | {ratio} | {us['map']:.2f} | {us['sink']:.2f} | {rss:.0f} |")
    if errors:
        sys.exit(1)


if __name__ == "__main__":
    main()
