// `company` in JavaScript: Maxwell CDC events of one table -> upsert
// records, and a sink that keeps a table current from them. Its map
// outputs are the Rust `company` plugin's, byte for byte
// (plugins/company/src/lib.rs says what each event becomes); the tests
// compare them under `host test`.
//
// Input: Maxwell's JSON (https://maxwells-daemon.io/dataformat/) with its
// default hash key, e.g. key {"database":"shop","table":"company","pk.id":1}.
// Output: key = the primary key object ({"id":1}, from the key's pk.*
// fields, else data.id), value = `data` as it was in the event (a delete:
// a tombstone); an update whose `old` changes the key first emits a
// tombstone for the old key. `--config table=…` (default company), `database=…`
// (default any), `sink_table=…` (default companies).

import * as sluice from 'sluice-guest';
import * as json from 'sluice-guest/json';
import * as sql from 'sluice-guest/sql';

const UPSERT = new Set(['insert', 'update', 'bootstrap-insert']);

class Company extends sluice.Mapper {
  constructor(config) {
    super(config);
    this.table = config.get('table', 'company');
    this.database = config.get('database');
  }

  map(record, emit) {
    if (record.value === null) return; // Maxwell never writes tombstones: nothing to apply
    const fields = json.objectFields(record.value);
    const event = new Map();
    for (const [name, raw] of fields) {
      // As the Rust plugin's serde struct: each of these once, and
      // `database`, `table` and `type` strings when present.
      if (['database', 'table', 'type', 'data', 'old'].includes(name) && event.has(name)) {
        throw new sluice.BadRecord(`unexpected JSON: duplicate field \`${name}\``);
      }
      event.set(name, raw);
    }
    for (const name of ['database', 'table', 'type']) {
      const raw = event.get(name);
      if (raw !== undefined && !['a string', 'null'].includes(json.kind(raw))) {
        throw new sluice.BadRecord(`unexpected JSON: \`${name}\` is ${json.kind(raw)}, not a string`);
      }
    }
    const text = (name) => json.string(event.get(name) ?? 'null');
    if (this.database !== null && text('database') !== this.database) return;
    if (text('table') !== this.table) return;
    const kind = text('type');
    if (kind === null) throw new sluice.BadRecord('Maxwell event without `type`');
    if (!UPSERT.has(kind) && kind !== 'delete') return; // bootstrap markers, DDL, heartbeats
    const data = event.get('data');
    // A null `data` is a missing one, as for the Rust plugin's `Option`.
    if (data === undefined || data.trim() === 'null') throw new sluice.BadRecord(`\`${kind}\` event without \`data\``);
    if (json.kind(data) !== 'an object') throw new sluice.BadRecord(`\`data\` is ${json.kind(data)}, not an object`);
    const pk = primaryKey(record.key, data);
    const old = event.get('old');
    if (UPSERT.has(kind) && old !== undefined) {
      const movedFrom = oldKey(pk, old);
      if (movedFrom !== null) emit(json.writeObject(movedFrom), null); // the row's old key goes
    }
    emit(json.writeObject(pk), UPSERT.has(kind) ? data : null);
  }
}

// The primary key before an update whose `old` (the changed columns'
// previous values) changes a column of `pk`, else null (also when `old`
// is not an object or a previous value is null).
function oldKey(pk, old) {
  if (json.kind(old) !== 'an object') return null;
  const previous = new Map(json.objectFields(old));
  const was = pk.map(([name, now]) => [name, previous.has(name) ? previous.get(name) : now]);
  if (was.some(([, v]) => v.trim() === 'null')) return null;
  if (was.every(([, v], i) => v.trim() === pk[i][1].trim())) return null;
  return was;
}

// The key's pk.* fields without the prefix, else {"id": data.id}; values
// kept as their source text.
function primaryKey(key, data) {
  let fields = [];
  if (key !== null) {
    try {
      fields = json.objectFields(key).filter(([n]) => n.startsWith('pk.')).map(([n, v]) => [n.slice(3), v]);
    } catch (e) {
      if (!(e instanceof json.JsonError)) throw e;
    }
  }
  if (!fields.length) {
    const row = new Map(json.objectFields(data));
    const id = row.get('id');
    if (id === undefined || id.trim() === 'null') {
      throw new sluice.BadRecord('no primary key: no `pk.*` in the key and no `data.id`');
    }
    fields = [['id', id]];
  }
  return fields;
}

const COLUMNS = ['pk', 'row_json', 'idempotency_key', 'source_topic', 'source_partition', 'source_offset', 'updated_at_ms'];

// One row per primary key: the row JSON, and the idempotency key, source
// coordinates and Kafka timestamp of its last change, written through
// `sql.Table` (multi-row statements, as the Rust company's).
class CompanySink extends sluice.Sink {
  constructor(config) {
    super(config);
    const t = sql.identifier('sink_table', config.get('sink_table', 'companies'));
    this.create =
      `CREATE TABLE IF NOT EXISTS ${t} (pk TEXT PRIMARY KEY, row_json TEXT NOT NULL, ` +
      'idempotency_key TEXT NOT NULL, source_topic TEXT NOT NULL, ' +
      'source_partition INTEGER NOT NULL, source_offset BIGINT NOT NULL, updated_at_ms BIGINT NOT NULL)';
    this.table = new sql.Table(t, COLUMNS, ['pk']);
  }

  init() {
    sql.execute(this.create);
  }

  writeChunk(records) {
    const changes = records.map(({ idempotencyKey, record: rec }, i) => {
      if (rec.key === null) throw new sluice.BadRecord('no key: the company sink keys rows by the record key', i);
      let pk;
      let row;
      try {
        pk = rec.keyText();
        row = rec.text();
      } catch (e) {
        throw new sluice.BadRecord(`the record is not UTF-8 text: ${e.message}`, i);
      }
      if (row === null) return ['delete', [pk]];
      return ['upsert', [pk, row, idempotencyKey, rec.topic, rec.partition, rec.offset, rec.timestamp]];
    });
    this.table.apply(changes);
  }
}

export const mapper = sluice.exportMap(Company);
export const sink = sluice.exportSink(CompanySink);
