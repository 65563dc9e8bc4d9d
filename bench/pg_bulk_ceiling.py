"""PostgreSQL's own bulk path for the changes of a Maxwell topic: a ceiling
for what a sink can get into the server, not a pipeline.

Reads every record of TOPIC first (not timed), keeps the company events
as (pk, row_json, offset, delete?) in stream order, then, timed, per chunk
of CHUNK changes in one transaction each: binary `COPY` into a temporary
staging table, one `DELETE … USING` of the keys whose last change in the
chunk is a delete, one `INSERT … SELECT DISTINCT ON (pk) … ON CONFLICT DO
UPDATE` of the others. Prints the timed seconds (the whole process's CPU
is measured by the caller).

Usage: pg_bulk_ceiling.py BOOTSTRAP TOPIC DB_URL CHUNK
"""
import json
import sys
import time

import psycopg
from confluent_kafka import Consumer, TopicPartition

bootstrap, topic, url, chunk = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-bulk-ceiling",
              "enable.auto.commit": False, "auto.offset.reset": "earliest"})
md = c.list_topics(topic, timeout=10)
parts = sorted(md.topics[topic].partitions)
remaining = sum(c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts)
c.assign([TopicPartition(topic, p, 0) for p in parts])
changes = []
while remaining > 0:
    for m in c.consume(num_messages=1000, timeout=1.0):
        if m.error():
            continue
        remaining -= 1
        ev = json.loads(m.value())
        if ev.get("table") != "company" or "data" not in ev:
            continue
        pk = json.dumps({"id": ev["data"]["id"]}, separators=(",", ":"))
        delete = ev["type"] == "delete"
        row = "" if delete else json.dumps(ev["data"], separators=(",", ":"))
        changes.append((len(changes), pk, row, m.offset(), delete))
c.close()

with psycopg.connect(url) as db:
    db.execute("CREATE TABLE IF NOT EXISTS companies (pk TEXT PRIMARY KEY, row_json TEXT NOT NULL,"
               " source_offset BIGINT NOT NULL)")
    db.commit()
    started = time.perf_counter()
    for at in range(0, len(changes), chunk):
        with db.cursor() as cur:
            cur.execute("CREATE TEMP TABLE staging (seq BIGINT, pk TEXT, row_json TEXT, source_offset BIGINT,"
                        " del BOOLEAN) ON COMMIT DROP")
            with cur.copy("COPY staging FROM STDIN (FORMAT BINARY)") as copy:
                copy.set_types(["int8", "text", "text", "int8", "bool"])
                for row in changes[at:at + chunk]:
                    copy.write_row(row)
            last = "SELECT DISTINCT ON (pk) pk, row_json, source_offset, del FROM staging ORDER BY pk, seq DESC"
            cur.execute(f"DELETE FROM companies c USING ({last}) s WHERE c.pk = s.pk AND s.del")
            cur.execute(f"INSERT INTO companies (pk, row_json, source_offset) SELECT pk, row_json, source_offset"
                        f" FROM ({last}) s WHERE NOT s.del ON CONFLICT (pk) DO UPDATE SET"
                        " row_json = excluded.row_json, source_offset = excluded.source_offset")
        db.commit()
    print(f"{time.perf_counter() - started:.6f} {len(changes)}")
