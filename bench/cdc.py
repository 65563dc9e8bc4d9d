#!/usr/bin/env python3
"""The cdc plugin against the company plugin on the same input.

Maxwell company events (inserts, updates, one delete in 50; the events
of bench/run.py) on the mock cluster, each pipeline into a fresh SQLite
file, `--until-caught-up`: company (one JSON row per company, one
statement per record) and cdc with `batch_rows` 10 (the default), 1 (one
statement per change), 100 and 1000 (multi-row statements). Each cdc table is
checked cell by cell against the producer's expected final state. The
median of RUNS interleaved runs; prints a markdown table.

Run with `bash bench/cdc.sh` (builds in release mode first). Environment:
RUNS (default 3), EVENTS (default 60000), PARTITIONS (default 6).
"""
import json
import os
import statistics
import sqlite3
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402  (the shared brokers, timing and medians)

CDC_TABLE = ("CREATE TABLE company (id INTEGER PRIMARY KEY, name TEXT NOT NULL, valuation TEXT, "
             "founded DATETIME, _sluice_position TEXT)")


def create_table(db):
    c = sqlite3.connect(db)
    c.execute(CDC_TABLE)
    c.commit()
    c.close()


def check_cdc(db, expected):
    """The cdc table equals the expected final rows, cell by cell."""
    c = sqlite3.connect(db)
    got = {r[0]: r[1:] for r in c.execute("SELECT id, name, valuation, founded FROM company")}
    c.close()
    want = {}
    for row in expected.values():
        r = json.loads(row, parse_float=str)  # the decimal's exact text
        # Maxwell's zero date becomes NULL (zero_dates=null, the default).
        want[r["id"]] = (r["name"], r["valuation"], None)
    if got != want:
        missing = len(set(want) - set(got))
        extra = len(set(got) - set(want))
        wrong = sum(1 for k in set(got) & set(want) if got[k] != want[k])
        raise RuntimeError(f"cdc table differs: {missing} missing, {extra} extra, {wrong} wrong rows")


def main():
    cells = {
        "company (one statement per record)": ("company", []),
        "cdc, batch_rows=10 (default)": ("cdc", ["route=shop.company=company"]),
        "cdc, batch_rows=1": ("cdc", ["route=shop.company=company", "batch_rows=1"]),
        "cdc, batch_rows=100": ("cdc", ["route=shop.company=company", "batch_rows=100"]),
        "cdc, batch_rows=1000": ("cdc", ["route=shop.company=company", "batch_rows=1000"]),
        "cdc, batch_rows=5000": ("cdc", ["route=shop.company=company", "batch_rows=5000"]),
    }
    with tempfile.TemporaryDirectory(prefix="bench-cdc-") as work, run.Mock() as broker:
        expected_file = os.path.join(work, "expected.json")
        subprocess.run([os.path.join(run.REL, "produce"), broker.bootstrap, "maxwell", str(run.PARTS),
                        str(run.EVENTS), expected_file], check=True, capture_output=True)
        with open(expected_file) as f:
            expected = json.load(f)

        runs = {}

        def cell(n, name, plugin, config):
            def go(i):
                sink = create_table if plugin == "cdc" else True
                stages = {}
                rate, rss, db = run.sluice(broker, plugin, sink, work, i, config, tag=f"-{n}",
                                           stages=stages)
                if plugin == "cdc":
                    check_cdc(db, expected)
                runs.setdefault(name, []).append((rate, rss, stages))
                return rate, rss, stages
            return go

        results, errors = run.interleaved({k: cell(n, k, *v) for n, (k, v) in enumerate(cells.items())})
    base = results.get("company (one statement per record)", (None,))[0]
    print(f"{run.EVENTS} Maxwell events, {run.PARTS} partitions, mock cluster, SQLite sink, "
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
