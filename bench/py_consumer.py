"""What users write today: a confluent-kafka consumer that parses Maxwell
JSON and upserts into SQLite (or PostgreSQL, with psycopg 3, when DB is a
postgres:// URL), committing every N records.

Usage: py_consumer.py BOOTSTRAP TOPIC DB COMMIT_EVERY
Reads every partition from offset 0 to the high watermark at start.
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
else:
    db = sqlite3.connect(db_path)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    P = "?"
db.execute(
    "CREATE TABLE IF NOT EXISTS companies (pk TEXT PRIMARY KEY, row_json TEXT NOT NULL,"
    " source_offset BIGINT NOT NULL)"
)
db.commit()
c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-python",
              "enable.auto.commit": False, "auto.offset.reset": "earliest"})
md = c.list_topics(topic, timeout=10)
parts = sorted(md.topics[topic].partitions)
remaining = 0
for p in parts:
    low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
    remaining += high
c.assign([TopicPartition(topic, p, 0) for p in parts])
since_commit = 0
while remaining > 0:
    for m in c.consume(num_messages=1000, timeout=1.0):
        if m.error():
            continue
        remaining -= 1
        try:
            ev = json.loads(m.value())
        except ValueError:
            continue
        if ev.get("table") != "company" or "data" not in ev:
            continue
        pk = json.dumps({"id": ev["data"]["id"]}, separators=(",", ":"))
        if ev["type"] == "delete":
            db.execute(f"DELETE FROM companies WHERE pk = {P}", (pk,))
        elif ev["type"] in ("insert", "update", "bootstrap-insert"):
            db.execute(
                f"INSERT INTO companies (pk, row_json, source_offset) VALUES ({P}, {P}, {P})"
                " ON CONFLICT (pk) DO UPDATE SET row_json = excluded.row_json,"
                " source_offset = excluded.source_offset",
                (pk, json.dumps(ev["data"], separators=(",", ":")), m.offset()),
            )
        since_commit += 1
        if since_commit >= every:
            db.commit()
            c.commit(asynchronous=False)
            since_commit = 0
db.commit()
c.close()
