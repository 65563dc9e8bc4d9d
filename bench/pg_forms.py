"""Server cost of the statement forms a bulk upsert can take on PostgreSQL,
for the company sink's table (7 columns), so the host's `sql.apply` can
use the cheapest: CPU seconds of the server's processes per million rows
(read from /proc, as bench/long.py does: run it with no other PostgreSQL
busy), and rows/s of the timed loop.

Forms, each in transactions of PART rows (a Sluice part), keys distinct
within a statement:
- values: `INSERT … VALUES (…), … ON CONFLICT DO UPDATE`, prepared, of 512
  rows per statement (what the host sends today);
- unnest: one `INSERT … SELECT * FROM unnest($1::text[], …) ON CONFLICT DO
  UPDATE` per part, one array parameter per column;
- copy: binary `COPY` into a session's temporary staging table (`ON COMMIT
  DELETE ROWS`), then one `INSERT … SELECT … ON CONFLICT DO UPDATE`.

Usage: pg_forms.py DB_URL [ROWS=1000000] [KEYS=ROWS] [ROUNDS=3]
(KEYS < ROWS: keys repeat, so later parts update rows instead of inserting.)
"""
import os
import statistics
import sys
import time

import psycopg

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from long import pg_server_cpu  # noqa: E402

URL = sys.argv[1]
ROWS = int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000
KEYS = int(sys.argv[3]) if len(sys.argv) > 3 else ROWS
ROUNDS = int(sys.argv[4]) if len(sys.argv) > 4 else 3
PART = 2000
STATEMENT = 512
COLUMNS = ["pk", "row_json", "idempotency_key", "source_topic", "source_partition", "source_offset",
           "updated_at_ms"]
TYPES = ["text", "text", "text", "text", "int4", "int8", "int8"]
UPDATE = ", ".join(f"{c} = excluded.{c}" for c in COLUMNS[1:])


def rows():
    """The company sink's rows: a part's keys are distinct (the host folds
    them), as in the no-fold benchmark when KEYS = ROWS."""
    out = []
    for i in range(ROWS):
        k = i % KEYS
        out.append((f'{{"id":{k}}}',
                    f'{{"id":{k},"name":"company {k}","revenue":"{k * 7 % 100000}.25","employees":{k % 977}}}',
                    f"maxwell/{i % 64}/{i}", "maxwell", i % 64, i, 1_700_000_000_000 + i))
    return out


def fresh(db):
    db.execute("DROP TABLE IF EXISTS companies")
    db.execute("CREATE TABLE companies (pk TEXT PRIMARY KEY, row_json TEXT NOT NULL, idempotency_key TEXT NOT NULL,"
               " source_topic TEXT NOT NULL, source_partition INT NOT NULL, source_offset BIGINT NOT NULL,"
               " updated_at_ms BIGINT NOT NULL)")
    db.commit()


def parts(data):
    for at in range(0, len(data), PART):
        part = data[at:at + PART]
        # Distinct keys per part, the last change of each (as the host folds).
        last = {r[0]: r for r in part}
        yield list(last.values())


def values(db, data):
    one = "(" + ", ".join(["%s"] * len(COLUMNS)) + ")"
    sql = {}
    for part in parts(data):
        with db.cursor() as cur:
            for at in range(0, len(part), STATEMENT):
                chunk = part[at:at + STATEMENT]
                n = len(chunk)
                if n not in sql:
                    sql[n] = (f"INSERT INTO companies ({', '.join(COLUMNS)}) VALUES {', '.join([one] * n)}"
                              f" ON CONFLICT (pk) DO UPDATE SET {UPDATE}")
                cur.execute(sql[n], [v for r in chunk for v in r], prepare=True)
        db.commit()


def unnest(db, data):
    arrays = ", ".join(f"%s::{t}[]" for t in TYPES)
    sql = (f"INSERT INTO companies ({', '.join(COLUMNS)}) SELECT * FROM unnest({arrays})"
           f" ON CONFLICT (pk) DO UPDATE SET {UPDATE}")
    for part in parts(data):
        cols = [list(c) for c in zip(*part)]
        with db.cursor() as cur:
            cur.execute(sql, cols, prepare=True)
        db.commit()


def copy(db, data):
    db.execute("CREATE TEMP TABLE IF NOT EXISTS staging (LIKE companies) ON COMMIT DELETE ROWS")
    db.commit()
    merge = (f"INSERT INTO companies ({', '.join(COLUMNS)}) SELECT {', '.join(COLUMNS)} FROM staging"
             f" ON CONFLICT (pk) DO UPDATE SET {UPDATE}")
    for part in parts(data):
        with db.cursor() as cur:
            with cur.copy(f"COPY staging ({', '.join(COLUMNS)}) FROM STDIN (FORMAT BINARY)") as cp:
                cp.set_types(TYPES)
                for r in part:
                    cp.write_row(r)
            cur.execute(merge, prepare=True)
        db.commit()


def main():
    data = rows()
    forms = {"values (512-row statements)": values, "unnest (one statement per part)": unnest,
             "copy + merge": copy}
    results = {k: [] for k in forms}
    for _ in range(ROUNDS):
        for name, form in forms.items():
            with psycopg.connect(URL) as db:
                fresh(db)
                before, t0 = pg_server_cpu(), time.perf_counter()
                form(db, data)
                wall, server = time.perf_counter() - t0, pg_server_cpu() - before
                n = db.execute("SELECT count(*) FROM companies").fetchone()[0]
                if n != min(KEYS, ROWS):
                    raise RuntimeError(f"{name}: {n} rows, expected {min(KEYS, ROWS)}")
            results[name].append((wall, server))
    print(f"{ROWS:,} rows, {min(KEYS, ROWS):,} keys, parts of {PART}, median of {ROUNDS} interleaved rounds\n")
    print("| form | rows/s (client loop) | server CPU s per 1M rows |")
    print("|---|---:|---:|")
    for name in forms:
        wall = statistics.median(w for w, _ in results[name])
        server = statistics.median(s for _, s in results[name])
        print(f"| {name} | {ROWS / wall:,.0f} | {server * 1e6 / ROWS:.2f} |")


if __name__ == "__main__":
    main()
