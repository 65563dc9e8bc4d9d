"""`company` in Python: Maxwell CDC events of one table -> upsert records,
and a sink that keeps a table current from them. Its map outputs are the
Rust `company` plugin's, byte for byte (plugins/company/src/lib.rs says
what each event becomes); the tests compare them under `host test`.

Input: Maxwell's JSON (https://maxwells-daemon.io/dataformat/) with its
default hash key, e.g. key {"database":"shop","table":"company","pk.id":1}.
Output: key = the primary key object ({"id":1}, from the key's pk.*
fields, else data.id), value = `data` as it was in the event (a delete: a
tombstone); an update whose `old` changes the key first emits a tombstone
for the old key. `--config table=…` (default company), `database=…` (default
any), `sink_table=…` (default companies).
"""

import sluice_guest as sluice
from sluice_guest import json, sql

UPSERT = {"insert", "update", "bootstrap-insert"}


class Company(sluice.Mapper):
    def __init__(self, config):
        self.table = config.get("table", "company")
        self.database = config.get("database")

    def map(self, record, emit):
        if record.value is None:
            return  # Maxwell never writes tombstones: nothing to apply
        fields = json.object_fields(record.value)
        event = dict(fields)
        # As the Rust plugin's serde struct: each of these once, and
        # `database` and `table` strings when present.
        for name in ("database", "table", "type", "data", "old"):
            if sum(1 for n, _ in fields if n == name) > 1:
                raise sluice.BadRecord(f"unexpected JSON: duplicate field `{name}`")
        for name in ("database", "table", "type"):
            raw = event.get(name)
            if raw is not None and json.kind(raw) not in ("a string", "null"):
                raise sluice.BadRecord(f"unexpected JSON: `{name}` is {json.kind(raw)}, not a string")
        if self.database is not None and json.string(event.get("database", "null")) != self.database:
            return
        if json.string(event.get("table", "null")) != self.table:
            return
        kind = json.string(event.get("type", "null"))
        if kind is None:
            raise sluice.BadRecord("Maxwell event without `type`")
        if kind not in UPSERT and kind != "delete":
            return  # bootstrap markers, DDL, heartbeats
        data = event.get("data")
        # A null `data` is a missing one, as for the Rust plugin's `Option`.
        if data is None or data.strip() == "null":
            raise sluice.BadRecord(f"`{kind}` event without `data`")
        if json.kind(data) != "an object":
            raise sluice.BadRecord(f"`data` is {json.kind(data)}, not an object")
        pk = primary_key(record.key, data)
        old = event.get("old")
        if kind in UPSERT and old is not None:
            moved_from = old_key(pk, old)
            if moved_from is not None:
                emit(json.write_object(moved_from), None)  # the row's old key goes
        emit(json.write_object(pk), data if kind in UPSERT else None)


def primary_key(key, data):
    """The key's pk.* fields without the prefix, else {"id": data.id};
    values kept as their source text."""
    fields = []
    if key is not None:
        try:
            fields = [(n[3:], v) for n, v in json.object_fields(key) if n.startswith("pk.")]
        except json.JsonError:
            fields = []
    if not fields:
        row = dict(json.object_fields(data))
        if row.get("id", "null").strip() == "null":
            raise sluice.BadRecord("no primary key: no `pk.*` in the key and no `data.id`")
        fields = [("id", row["id"])]
    return fields


def old_key(pk, old):
    """The primary key before an update whose `old` (the changed columns'
    previous values) changes a column of `pk`, else None (also when `old`
    is not an object or a previous value is null)."""
    if json.kind(old) != "an object":
        return None
    previous = dict(json.object_fields(old))
    was = [(name, previous.get(name, now)) for name, now in pk]
    if any(v.strip() == "null" for _, v in was):
        return None
    if all(v.strip() == now.strip() for (_, v), (_, now) in zip(was, pk)):
        return None
    return was


class CompanySink(sluice.Sink):
    """One row per primary key: the row JSON, and the idempotency key,
    source coordinates and Kafka timestamp of its last change, written
    through `sql.Table` (multi-row statements, as the Rust company's)."""

    COLUMNS = ["pk", "row_json", "idempotency_key", "source_topic", "source_partition", "source_offset", "updated_at_ms"]

    def __init__(self, config):
        t = sql.identifier("sink_table", config.get("sink_table", "companies"))
        self.create = (
            f"CREATE TABLE IF NOT EXISTS {t} (pk TEXT PRIMARY KEY, row_json TEXT NOT NULL, "
            "idempotency_key TEXT NOT NULL, source_topic TEXT NOT NULL, "
            "source_partition INTEGER NOT NULL, source_offset BIGINT NOT NULL, updated_at_ms BIGINT NOT NULL)"
        )
        self.table = sql.Table(t, self.COLUMNS, ["pk"])

    def init(self):
        sql.execute(self.create)

    def write_chunk(self, records):
        changes = []
        for i, r in enumerate(records):
            rec = r.record
            if rec.key is None:
                raise sluice.BadRecord("no key: the company sink keys rows by the record key", index=i)
            try:
                pk = rec.key.decode("utf-8")
                row = None if rec.value is None else rec.value.decode("utf-8")
            except UnicodeDecodeError as e:
                raise sluice.BadRecord(f"the record is not UTF-8 text: {e}", index=i) from None
            if row is None:
                changes.append(("delete", [pk]))
            else:
                changes.append(
                    ("upsert", [pk, row, r.idempotency_key, rec.topic, rec.partition, rec.offset, rec.timestamp])
                )
        self.table.apply(changes)


Mapper = sluice.export_map(Company)
Sink = sluice.export_sink(CompanySink)
