"""The faster thing users write: a confluent-kafka consumer that keeps each
key's last change per COMMIT_EVERY records and writes them with
`executemany` (psycopg 3 pipelines it on PostgreSQL; sqlite3 loops in C),
then commits the database and the offsets. At-least-once: a crash between
the two commits applies the last chunk again.

Usage: py_batch_consumer.py BOOTSTRAP TOPIC DB COMMIT_EVERY
DB is a SQLite file or a postgres:// URL. Reads every partition from
offset 0 to the high watermark at start; writes the `companies` table of
bench/py_consumer.py (pk, row_json, source_offset).
"""
import json
import sqlite3
import sys

from confluent_kafka import Consumer, TopicPartition

bootstrap, topic, db_path, every = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
if db_path.startswith("postgres"):
    import psycopg
    db = psycopg.connect(db_path)
    P = "%s"

    def many(sql, rows):
        with db.cursor() as cur:
            cur.executemany(sql, rows)
else:
    db = sqlite3.connect(db_path)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    P = "?"

    def many(sql, rows):
        db.executemany(sql, rows)
db.execute(
    "CREATE TABLE IF NOT EXISTS companies (pk TEXT PRIMARY KEY, row_json TEXT NOT NULL,"
    " source_offset BIGINT NOT NULL)"
)
db.commit()
UPSERT = (f"INSERT INTO companies (pk, row_json, source_offset) VALUES ({P}, {P}, {P})"
          " ON CONFLICT (pk) DO UPDATE SET row_json = excluded.row_json,"
          " source_offset = excluded.source_offset")
DELETE = f"DELETE FROM companies WHERE pk = {P}"

c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-python-batch",
              "enable.auto.commit": False, "auto.offset.reset": "earliest"})
md = c.list_topics(topic, timeout=10)
parts = sorted(md.topics[topic].partitions)
remaining = 0
for p in parts:
    low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
    remaining += high
c.assign([TopicPartition(topic, p, 0) for p in parts])


def flush(last):
    """Write each key's last change (deletes first, then upserts: a key
    has one change here), commit the database, then the offsets."""
    deletes = [(pk,) for pk, change in last.items() if change is None]
    upserts = [(pk, row, off) for pk, change in last.items() if change is not None for row, off in [change]]
    if deletes:
        many(DELETE, deletes)
    if upserts:
        many(UPSERT, upserts)
    db.commit()
    if consumed:
        c.commit(asynchronous=False)


last = {}
seen = consumed = 0
while remaining > 0:
    for m in c.consume(num_messages=1000, timeout=1.0):
        if m.error():
            continue
        remaining -= 1
        consumed += 1
        try:
            ev = json.loads(m.value())
        except ValueError:
            continue
        if ev.get("table") != "company" or "data" not in ev:
            continue
        pk = json.dumps({"id": ev["data"]["id"]}, separators=(",", ":"))
        if ev["type"] == "delete":
            last[pk] = None
        elif ev["type"] in ("insert", "update", "bootstrap-insert"):
            last[pk] = (json.dumps(ev["data"], separators=(",", ":")), m.offset())
        seen += 1
        if seen >= every:
            flush(last)
            last, seen, consumed = {}, 0, 0
flush(last)
c.close()
