// Unit tests of the JavaScript SDK under Node.js (`node --test`): the
// packed formats, the map loop, config, JSON with raw values, the SQL
// value mapping, `Table`'s statements and the build's helpers. The
// component side is tested end to end by the host's tests
// (tests/e2e/js.rs).

import assert from 'node:assert/strict';
import { test } from 'node:test';

import * as sluice from '../src/index.js';
import { frame } from '../src/index.js';
import * as json from '../src/json.js';
import { NativeHost, install } from '../src/host.js';
import { Table, toWit, fromWit } from '../src/sql.js';
import { mapRecords, mapValues, make, text } from '../src/testing.js';
import { Outputs, Record, WireError, readOutputs, readRecords, readSinkRecords, writeRecords, writeSinkRecords } from '../src/wire.js';
import { entrySource, exportProblems, worldFor } from '../src/build.js';

const utf8 = (s) => new TextEncoder().encode(s);

test('packed records round-trip, with null keys, tombstones, empty values and headers', () => {
  const records = [
    new Record('t', 3, 42, 1_700_000_000_000, 'create-time', utf8('k'), utf8('v'), [['h', utf8('x')], ['none', null]]),
    new Record('t', 3, 43, 0, 'not-available', null, null, []),
    new Record('ü', -1, 2 ** 40, 5, 'log-append-time', new Uint8Array(), new Uint8Array(), []),
  ];
  assert.deepEqual(readRecords(writeRecords(records)), records);
  const sink = readSinkRecords(writeSinkRecords([['t/3/42', records[0]], ['t/3/42#1', records[1]]]));
  assert.deepEqual(sink, [['t/3/42', records[0]], ['t/3/42#1', records[1]]]);
});

test('a truncated or malformed buffer is a WireError', () => {
  const packed = writeRecords([new Record('t', 0, 1, 0, 'create-time', null, utf8('v'), [])]);
  assert.throws(() => readRecords(packed.subarray(0, packed.length - 1)), WireError);
  const bad = packed.slice();
  bad[4 + 4 + 1 + 4 + 8 + 8] = 7; // the timestamp type
  assert.throws(() => readRecords(bad), /timestamp type 7/);
});

test('outputs carry their input index; a rewind drops what was pushed since the mark', () => {
  const o = new Outputs();
  o.push(0, 'k', 'v', [['h', null]]);
  const mark = o.mark();
  o.push(1, null, null);
  o.rewind(mark);
  o.push(2, new Uint8Array([1]), null);
  const out = readOutputs(o.finish());
  assert.deepEqual(out.map((x) => x.inputIndex), [0, 2]);
  assert.equal(text(out[0].value), 'v');
  assert.deepEqual(out[0].headers, [['h', null]]);
  assert.equal(out[1].value, null);
  assert.throws(() => o.push(3, 'k', undefined), /value must be a Uint8Array, a string or null, not undefined/);
  assert.throws(() => o.push(3, 'k', 'v', [[1, 'x']]), /header name must be a string/);
});

class Upper extends sluice.Mapper {
  constructor(config) {
    super(config);
    this.suffix = config.get('suffix', '');
    this.times = config.int('times', 1);
  }

  map(record, emit) {
    if (record.value === null) throw new sluice.BadRecord('tombstone');
    for (let i = 0; i < this.times; i++) emit(record.key, record.text().toUpperCase() + this.suffix);
    if (record.text() === 'half') throw new sluice.BadRecord('rejected after an emit');
  }
}

test('map: outputs in order, a BadRecord rejects only its record and drops its outputs', () => {
  const r = mapValues(Upper, ['a', null, 'half', 'b'], { suffix: '!', times: '2' });
  assert.deepEqual(r.outputs.map((o) => [o.inputIndex, text(o.value)]), [
    [0, 'A!'],
    [0, 'A!'],
    [3, 'B!'],
    [3, 'B!'],
  ]);
  assert.deepEqual(r.rejected, [
    [1, 'tombstone'],
    [2, 'rejected after an emit'],
  ]);
});

test('a value that is not UTF-8 is a bad record through text()', () => {
  const r = mapRecords(Upper, [new Record('t', 0, 0, 0, 'create-time', null, new Uint8Array([0xff]), [])]);
  assert.deepEqual(r.rejected, [[0, 'the value is not UTF-8 text']]);
});

test('any other error thrown by a stage propagates (the component traps)', () => {
  class Throws extends sluice.Mapper {
    map() {
      throw new RangeError('boom');
    }
  }
  assert.throws(() => mapValues(Throws, ['x']), RangeError);
});

test('config: get, int, bool, require and all', () => {
  install(new NativeHost({ n: ' 12 ', b: 'Yes', x: 'twelve', s: 'v' }));
  const c = new sluice.Config();
  assert.equal(c.get('s'), 'v');
  assert.equal(c.get('missing', 'd'), 'd');
  assert.equal(c.int('n'), 12);
  assert.throws(() => c.int('x'), sluice.Fatal);
  assert.equal(c.bool('b'), true);
  assert.throws(() => c.bool('x'), /is not true or false/);
  assert.throws(() => c.require('missing'), /--config missing=/);
  assert.deepEqual(Object.keys(c.all()), ['b', 'n', 's', 'x']);
});

test('json: object fields keep their raw text, numbers included', () => {
  const f = json.objectFields(utf8(' {"a" : 999999999999.999998, "b":{"c":[1, "x"]}, "d":"\\u00fc\\ud83d\\ude00", "e":null} '));
  assert.deepEqual(f, [
    ['a', '999999999999.999998'],
    ['b', '{"c":[1, "x"]}'],
    ['d', '"\\u00fc\\ud83d\\ude00"'],
    ['e', 'null'],
  ]);
  assert.equal(json.string(f[2][1]), 'ü😀');
  assert.equal(json.kind(f[1][1]), 'an object');
  assert.equal(json.writeObject([['n"', '1'], ['m', '[2]']]), '{"n\\"":1,"m":[2]}');
  assert.deepEqual(json.objectFields('{}'), []);
  // Escaped quotes and backslashes, brackets inside strings, nesting.
  assert.deepEqual(json.objectFields(' { "a\\\\" : 1 , "b":"x\\"y\\\\", "c":{"d":"}]"} , "e" : [1,{"f":[]}] ,"g":-1.5e3}\n'), [
    ['a\\', '1'],
    ['b', '"x\\"y\\\\"'],
    ['c', '{"d":"}]"}'],
    ['e', '[1,{"f":[]}]'],
    ['g', '-1.5e3'],
  ]);
});

test('json: what is not JSON or not an object is a JsonError, which is a BadRecord', () => {
  for (const bad of [
    '{"a":NaN}',
    '{"a":Infinity}',
    '{"a":01}',
    '{"a":1,}',
    '{"\\ud800":1}',
    '\ufeff{"a":1}',
    '{"a":"x\ty"}',
    '{"a":1} x',
    '{a:1}',
    '{"a":tru}',
    '[' .repeat(200) + ']'.repeat(200),
    `{"a":${'['.repeat(200)}${']'.repeat(199)}}`,
    '{"a":[1 2]}',
    '{"a":{"b" 1}}',
  ]) {
    assert.throws(() => json.objectFields(bad), (e) => e instanceof json.JsonError && e instanceof sluice.BadRecord, bad);
  }
  assert.throws(() => json.objectFields('[1]'), /unexpected JSON: an array, not an object/);
  assert.throws(() => json.objectFields(new Uint8Array([0xef, 0xbb, 0xbf, 0x7b, 0x7d])), json.JsonError, 'a BOM is not JSON');
  // As serde_json's RawValue: values are checked for their grammar only.
  const deep = `${'['.repeat(100_000)}${']'.repeat(100_000)}`;
  assert.deepEqual(json.objectFields(`{"a":"\\ud800","b":${deep}}`), [['a', '"\\ud800"'], ['b', deep]]);
  assert.throws(() => json.objectFields(new Uint8Array([0x7b, 0xff, 0x7d])), /not UTF-8/);
});

test('sql values: integers as BigInt, reals, text, blobs and null, and back', () => {
  assert.deepEqual(toWit(5), { tag: 'integer', val: 5n });
  assert.deepEqual(toWit(true), { tag: 'integer', val: 1n });
  assert.deepEqual(toWit(2n ** 63n - 1n), { tag: 'integer', val: 2n ** 63n - 1n });
  assert.throws(() => toWit(2n ** 63n), /fit 64 bits/);
  assert.deepEqual(toWit(1.5), { tag: 'real', val: 1.5 });
  assert.deepEqual(toWit(undefined), { tag: 'null' });
  assert.throws(() => toWit({}), /an SQL parameter must be/);
  assert.equal(fromWit({ tag: 'integer', val: 7n }), 7);
  assert.equal(fromWit({ tag: 'integer', val: 2n ** 60n }), 2n ** 60n);
  assert.equal(fromWit({ tag: 'null' }), null);
});

test('sql numbers: -0 stays a real, integers beyond 2^53 must be BigInt', () => {
  assert.deepEqual(toWit(-0), { tag: 'real', val: -0 });
  assert.throws(() => toWit(2 ** 53), /pass a BigInt/);
  assert.deepEqual(toWit(NaN), { tag: 'real', val: NaN });
});

test('offsets and timestamps beyond 2^53 arrive as BigInt, not as a fatal error', () => {
  const r = new Record('t', 0, 2n ** 60n, -(2n ** 62n), 'create-time', null, null, []);
  const [back] = readRecords(writeRecords([r]));
  assert.equal(back.offset, 2n ** 60n);
  assert.equal(back.timestamp, -(2n ** 62n));
  assert.equal(readRecords(writeRecords([new Record('t', 0, 7, 8, 'create-time', null, null, [])]))[0].offset, 7);
});

test('a UTF-8 BOM is kept in text()', () => {
  const r = new Record('t', 0, 0, 0, 'create-time', null, new Uint8Array([0xef, 0xbb, 0xbf, 0x41]), []);
  assert.equal(r.text(), '\ufeffA');
});

test('an async stage method is refused, not silently dropped', () => {
  class Later extends sluice.Mapper {
    async map(record, emit) {
      emit(null, 'late');
    }
  }
  assert.throws(() => mapValues(Later, ['x']), /must be synchronous/);
});

test('a sink BadRecord without a valid index is fatal; with one it names the record', () => {
  install(new NativeHost());
  const chunk = writeSinkRecords([
    ['t/0/0', new Record('t', 0, 0, 0, 'create-time', null, utf8('a'), [])],
    ['t/0/1', new Record('t', 0, 1, 0, 'create-time', null, utf8('b'), [])],
  ]);
  const sinkWith = (index) =>
    sluice.exportSink(
      class extends sluice.Sink {
        writeChunk() {
          throw new sluice.BadRecord('no', index);
        }
      },
    );
  const ctx = { topic: 't', partition: 0, startOffset: 0n, endOffset: 2n, batch: { queryId: 'q', batchId: 0n, epoch: 1n } };
  const thrown = (index) => {
    const s = sinkWith(index);
    assert.equal(s.open(ctx), 'proceed');
    try {
      s.write(chunk);
    } catch (e) {
      return e;
    }
    return null;
  };
  assert.deepEqual(thrown(1), { tag: 'bad-record', val: { index: 1, message: 'no' } });
  for (const bad of [1.5, 2, -1, null]) assert.equal(thrown(bad).tag, 'fatal', String(bad));
  assert.throws(() => sinkWith(0).write(chunk), (e) => e.tag === 'fatal' && /before a successful open/.test(e.val));
});

test('sql without a connection: a clear SqlError', () => {
  install(new NativeHost());
  assert.throws(() => sluice.sql.execute('SELECT 1'), /no sql capability granted/);
});

test('Table: one host call with the target and the changes as WIT variants', () => {
  const sent = [];
  install(
    Object.assign(new NativeHost(), {
      sql: () => ({
        apply(target, changes) {
          sent.push([target, changes]);
          return BigInt(changes.length);
        },
        applyVersioned(target, guard, changes) {
          sent.push([target, guard, changes]);
          return 1n;
        },
      }),
    }),
  );
  const t = new Table('t', ['k', 'v'], ['k']);
  assert.equal(t.apply([]), 0);
  assert.equal(t.apply([['upsert', [1, 'a']], ['delete', [2]], ['upsert', [null, 'x']]]), 3);
  assert.deepEqual(sent, [
    [
      { table: 't', columns: ['k', 'v'], key: ['k'] },
      [
        { tag: 'upsert', val: [{ tag: 'integer', val: 1n }, { tag: 'text', val: 'a' }] },
        { tag: 'delete', val: [{ tag: 'integer', val: 2n }] },
        { tag: 'upsert', val: [{ tag: 'null' }, { tag: 'text', val: 'x' }] },
      ],
    ],
  ]);
  sent.length = 0;
  assert.equal(t.applyVersioned('v', 'a:', [['delete', [2, 'a:9']]]), 1);
  assert.deepEqual(sent, [
    [
      { table: 't', columns: ['k', 'v'], key: ['k'] },
      { column: 'v', low: { tag: 'text', val: 'a:' } },
      [{ tag: 'delete', val: [{ tag: 'integer', val: 2n }, { tag: 'text', val: 'a:9' }] }],
    ],
  ]);
  assert.equal(t.applyVersioned('v', null, []), 0);
  assert.throws(() => new Table('t;', ['k'], ['k']), sluice.Fatal);
  assert.throws(() => new Table('t', ['k'], ['x']), /key column x is not a column/);
  assert.throws(() => new Table('t', ['k', 'k'], ['k']), /each named once/);
  assert.throws(() => t.apply([['merge', [1, 2]]]), (e) => e instanceof sluice.sql.SqlError && e.row === 0);
  assert.throws(() => new Table('t', 'pk', 'pk'), /arrays of names/);
  // Without a connection: a clear SqlError.
  install(new NativeHost());
  assert.throws(() => t.apply([['delete', [1]]]), /no sql capability granted/);
});

test('a stage made by make() sees its config', () => {
  const s = make(Upper, { suffix: '?' });
  assert.equal(s.suffix, '?');
});

test('stack frames map back to the sources through the line table', () => {
  const table = { sources: ['app.js', 'sluice-guest/index.js'], lines: [0, [0, 27], [1, 186]] };
  assert.equal(frame('raise@plugin.js:1:9', table), 'raise (app.js:27)');
  assert.equal(frame('@plugin.js:2:1', table), '<anonymous> (sluice-guest/index.js:186)');
  assert.equal(frame('x@/tmp/sources/initializer.js:3:1', table), null);
  assert.equal(frame('not a frame', table), null);
});

test('build: the world follows the exports; the entry installs the host', () => {
  assert.equal(worldFor(['mapper']), 'map-plugin');
  assert.equal(worldFor(['sink', 'other']), 'sink-plugin');
  assert.equal(worldFor(['mapper', 'sink']), 'map-sink-plugin');
  assert.equal(worldFor(['default']), null);
  const map = entrySource('/p/app.js', 'map-plugin');
  assert.match(map, /export \{ mapper \} from "\/p\/app.js"/);
  assert.doesNotMatch(map, /sluice:plugin\/sql/);
  assert.match(entrySource('/p/app.js', 'map-sink-plugin'), /import \* as sql from 'sluice:plugin\/sql@0.2.4'/);
});

test('build: a stage under the wrong name, or a stage class never exported as a stage, is refused', () => {
  class Keep extends sluice.Mapper {}
  class Store extends sluice.Sink {}
  assert.deepEqual(exportProblems({ mapper: sluice.exportMap(Keep), sink: sluice.exportSink(Store), Keep, Store }), []);
  assert.match(exportProblems({ Mapper: sluice.exportMap(Keep) })[0], /`Mapper` is a map stage, but the contract finds it only as `mapper`/);
  assert.match(exportProblems({ Keep, sink: sluice.exportSink(Store) })[0], /`Keep` is a map stage class, but no map stage is exported/);
  assert.equal(exportProblems({ mapper: sluice.exportSink(Store) }).length, 1);
});

test('json.string refuses a lone surrogate escape, as serde_json does for a string', () => {
  assert.throws(() => json.string('"\\ud800"'), json.JsonError);
  assert.equal(json.string('"\\ud83d\\ude00"'), '😀');
});

test('an uncaught value that looks like a stage-error still traps', () => {
  class Sneaky extends sluice.Mapper {
    map() {
      throw { tag: 'bad-record', val: { index: 0, message: 'looks bad' } };
    }
  }
  install(new NativeHost());
  const m = sluice.exportMap(Sneaky);
  const records = writeRecords([new Record('t', 0, 0, 0, 'create-time', null, utf8('x'), [])]);
  const original = console.error;
  console.error = () => {};
  try {
    assert.throws(() => m.map({}, records), (e) => e instanceof Error && /uncaught in map/.test(e.message));
  } finally {
    console.error = original;
  }
});
