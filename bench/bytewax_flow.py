"""The same work as bench/py_consumer.py as a Bytewax dataflow: Kafka input
(bytewax.connectors.kafka, read from the beginning, stopping at the end of
every partition), a filter_map step that parses the Maxwell JSON, and an
output that upserts or deletes each change in SQLite (or PostgreSQL, for a
postgres:// URL) and commits once per batch Bytewax hands it.

Run as `python -m bytewax.run bench/bytewax_flow.py:flow` with BENCH_BROKERS,
BENCH_TOPIC and BENCH_DB set. Single worker, no recovery store: like the
hand-written consumer, at least once.
"""
import json
import os
import sqlite3

import bytewax.operators as op
from bytewax.connectors.kafka import operators as kop
from bytewax.dataflow import Dataflow
from bytewax.outputs import DynamicSink, StatelessSinkPartition

DB = os.environ["BENCH_DB"]
PG = DB.startswith("postgres")
P = "%s" if PG else "?"
UPSERT = (f"INSERT INTO companies (pk, row_json, source_offset) VALUES ({P}, {P}, {P})"
          " ON CONFLICT (pk) DO UPDATE SET row_json = excluded.row_json,"
          " source_offset = excluded.source_offset")
DELETE = f"DELETE FROM companies WHERE pk = {P}"


def change(msg):
    """A Maxwell event of table company as (op, pk, row_json, offset), or None."""
    try:
        ev = json.loads(msg.value)
    except ValueError:
        return None
    if ev.get("table") != "company" or "data" not in ev:
        return None
    pk = json.dumps({"id": ev["data"]["id"]}, separators=(",", ":"))
    if ev["type"] == "delete":
        return ("delete", pk, None, msg.offset)
    if ev["type"] in ("insert", "update", "bootstrap-insert"):
        return ("upsert", pk, json.dumps(ev["data"], separators=(",", ":")), msg.offset)
    return None


class _Part(StatelessSinkPartition):
    def __init__(self):
        if PG:
            import psycopg
            self.db = psycopg.connect(DB)
        else:
            self.db = sqlite3.connect(DB)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute("CREATE TABLE IF NOT EXISTS companies (pk TEXT PRIMARY KEY, row_json TEXT NOT NULL,"
                        " source_offset BIGINT NOT NULL)")
        self.db.commit()

    def write_batch(self, items):
        for kind, pk, row, offset in items:
            if kind == "delete":
                self.db.execute(DELETE, (pk,))
            else:
                self.db.execute(UPSERT, (pk, row, offset))
        self.db.commit()

    def close(self):
        self.db.commit()
        self.db.close()


class CompaniesSink(DynamicSink):
    def build(self, step_id, worker_index, worker_count):
        return _Part()


flow = Dataflow("bench_bytewax")
kin = kop.input("kafka_in", flow, brokers=[os.environ["BENCH_BROKERS"]], topics=[os.environ["BENCH_TOPIC"]],
                tail=False)
changes = op.filter_map("parse", kin.oks, change)
op.output("companies", changes, CompaniesSink())
