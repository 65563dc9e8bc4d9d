"""Which statement form gets upserts into PostgreSQL fastest (issue 39's
choice for the SQL capability's bulk path), without Kafka or Sluice:

- values: multi-row `INSERT … VALUES (…), (…) ON CONFLICT DO UPDATE`,
  ROWS_PER_STATEMENT rows a statement (today's cdc and company sinks);
- executemany: one-row upserts pipelined by psycopg 3;
- unnest: one `INSERT … SELECT * FROM unnest($1::text[], …) ON CONFLICT
  DO UPDATE` per chunk, the columns as array parameters;
- copy: binary `COPY` into a temporary table, then one `INSERT … SELECT
  … ON CONFLICT DO UPDATE` per chunk.

Each form writes CHANGES changes (default 128,000: one Sluice batch of the
long benchmark) of a `companies`-shaped table (text key, a ~200-byte JSON
text, a bigint) in chunks of CHUNK (default 128,000), into a table that
already holds half of the keys (so half the rows update), one transaction
per chunk; median of RUNS (default 3) interleaved runs. Prints rows/s and
the server's CPU seconds per million rows (bench/long.py's
pg_server_cpu: the server must be local).

Usage: PG_URL=postgres://… python3 bench/pg_bulk_forms.py (psycopg 3).
"""
import json
import os
import statistics
import sys
import time

import psycopg

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from long import pg_server_cpu  # noqa: E402

URL = os.environ["PG_URL"]
CHANGES = int(os.environ.get("CHANGES", "128000"))
CHUNK = int(os.environ.get("CHUNK", "128000"))
ROWS = int(os.environ.get("ROWS_PER_STATEMENT", "1000"))
RUNS = int(os.environ.get("RUNS", "3"))

ROWS_DATA = [
    (json.dumps({"id": i}), json.dumps({"id": i, "name": f"Company {i}", "valuation": f"{i}.123456",
                                        "founded": "0000-00-00 00:00:00", "pad": "x" * 100}), i)
    for i in range(CHANGES)
]
UPDATE = "ON CONFLICT (pk) DO UPDATE SET row_json = excluded.row_json, source_offset = excluded.source_offset"


def fresh(db):
    db.execute("DROP TABLE IF EXISTS companies")
    db.execute("CREATE TABLE companies (pk TEXT PRIMARY KEY, row_json TEXT NOT NULL, source_offset BIGINT NOT NULL)")
    with db.cursor() as cur, cur.copy("COPY companies FROM STDIN") as copy:
        for r in ROWS_DATA[::2]:
            copy.write_row((r[0], "old", 0))
    db.commit()


def values(db, chunk):
    for at in range(0, len(chunk), ROWS):
        part = chunk[at:at + ROWS]
        cells = ", ".join("(%s, %s, %s)" for _ in part)
        db.execute(f"INSERT INTO companies (pk, row_json, source_offset) VALUES {cells} {UPDATE}",
                   [v for r in part for v in r])


def executemany(db, chunk):
    with db.cursor() as cur:
        cur.executemany(f"INSERT INTO companies (pk, row_json, source_offset) VALUES (%s, %s, %s) {UPDATE}", chunk)


def unnest(db, chunk):
    db.execute("INSERT INTO companies (pk, row_json, source_offset) "
               f"SELECT * FROM unnest(%s::text[], %s::text[], %s::int8[]) {UPDATE}",
               [[r[0] for r in chunk], [r[1] for r in chunk], [r[2] for r in chunk]])


def copy(db, chunk):
    with db.cursor() as cur:
        cur.execute("CREATE TEMP TABLE staging (pk TEXT, row_json TEXT, source_offset BIGINT) ON COMMIT DROP")
        with cur.copy("COPY staging FROM STDIN (FORMAT BINARY)") as c:
            c.set_types(["text", "text", "int8"])
            for r in chunk:
                c.write_row(r)
        cur.execute(f"INSERT INTO companies (pk, row_json, source_offset) SELECT * FROM staging {UPDATE}")


FORMS = {"values": values, "executemany": executemany, "unnest": unnest, "copy": copy}


def main():
    results = {k: [] for k in FORMS}
    with psycopg.connect(URL) as db:
        for _ in range(RUNS):
            for name, form in FORMS.items():
                fresh(db)
                cpu0, t0 = pg_server_cpu(), time.perf_counter()
                for at in range(0, CHANGES, CHUNK):
                    form(db, ROWS_DATA[at:at + CHUNK])
                    db.commit()
                seconds, cpu = time.perf_counter() - t0, pg_server_cpu() - cpu0
                got = db.execute("SELECT count(*), sum(source_offset) FROM companies").fetchone()
                if got != (CHANGES, sum(r[2] for r in ROWS_DATA)):
                    raise RuntimeError(f"{name}: table holds {got}")
                results[name].append((CHANGES / seconds, cpu * 1e6 / CHANGES))
    print(f"{CHANGES:,} upserts (half of them updates), chunks of {CHUNK:,}, values: {ROWS} rows a statement, "
          f"median of {RUNS} interleaved runs\n")
    print("| form | rows/s | server CPU s per 1M rows |")
    print("|---|---:|---:|")
    for name, runs in results.items():
        print(f"| {name} | {statistics.median(r[0] for r in runs):,.0f} | "
              f"{statistics.median(r[1] for r in runs):.2f} |")


if __name__ == "__main__":
    main()
