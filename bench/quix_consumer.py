"""Quix Streams doing the same job with its own checkpointing.

Usage: quix_consumer.py BOOTSTRAP TOPIC DB_PATH TOTAL
Stops once TOTAL records were processed.
"""
import json
import os
import sqlite3
import sys

from quixstreams import Application

bootstrap, topic_name, db_path, total = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
db = sqlite3.connect(db_path, check_same_thread=False)
db.execute("PRAGMA journal_mode=WAL")
db.execute("PRAGMA synchronous=FULL")
db.execute("CREATE TABLE IF NOT EXISTS companies (pk TEXT PRIMARY KEY, row_json TEXT NOT NULL)")
app = Application(broker_address=bootstrap, consumer_group=f"bench-quix-{os.getpid()}", auto_offset_reset="earliest",
                  state_dir=db_path + ".state")
topic = app.topic(topic_name, value_deserializer="bytes")
sdf = app.dataframe(topic)
seen = {"n": 0}


def apply(value: bytes):
    seen["n"] += 1
    try:
        ev = json.loads(value)
    except ValueError:
        return
    if ev.get("table") == "company" and "data" in ev:
        pk = json.dumps({"id": ev["data"]["id"]}, separators=(",", ":"))
        if ev["type"] == "delete":
            db.execute("DELETE FROM companies WHERE pk = ?", (pk,))
        else:
            db.execute("INSERT INTO companies (pk, row_json) VALUES (?, ?) ON CONFLICT (pk)"
                       " DO UPDATE SET row_json = excluded.row_json",
                       (pk, json.dumps(ev["data"], separators=(",", ":"))))
    if seen["n"] % 1000 == 0 or seen["n"] >= total:
        db.commit()
    if seen["n"] >= total:
        app.stop()


sdf = sdf.update(apply)
app.run()
db.commit()
