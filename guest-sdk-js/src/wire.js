// The packed batch formats of `wit/plugin.wit` (`packed-records`,
// `packed-outputs`, `packed-sink-records`), read and written with a
// DataView. All integers little-endian; `bytes` is a u32 length then the
// bytes; `opt-bytes` is a u32 length, or 0xFFFF_FFFF for none.
//
// Plugin authors never see these: the SDK hands stages `Record` objects.

import { BadRecord } from './errors.js';

const NONE = 0xffff_ffff;

/** The WIT `timestamp-type` enum, by its wire value. */
export const TIMESTAMP_TYPES = ['not-available', 'create-time', 'log-append-time'];

const UTF8 = new TextEncoder();
// `ignoreBOM`: a leading U+FEFF is part of the text (as in Rust and Python).
const STRICT = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

/** A packed buffer that does not follow the layout (a host bug). */
export class WireError extends Error {
  constructor(message) {
    super(message);
    this.name = 'WireError';
  }
}

/**
 * A Kafka record as a stage sees it.
 *
 * `key` and `value` are `Uint8Array` or `null`: a `value` of `null` is a
 * tombstone (a delete marker for compacted topics), an empty array an
 * empty value. `partition` is a number; `offset` and `timestamp` (ms
 * since the Unix epoch, 0 when `timestampType` is `'not-available'`) are
 * numbers, or BigInt in the rare case they lie beyond ±2^53 (a producer
 * may set any 64-bit timestamp).
 * `headers` is an array of `[name, value]` pairs, the value a
 * `Uint8Array` or `null`.
 */
export class Record {
  constructor(topic, partition, offset, timestamp, timestampType, key, value, headers = []) {
    this.topic = topic;
    this.partition = partition;
    this.offset = offset;
    this.timestamp = timestamp;
    this.timestampType = timestampType;
    this.key = key;
    this.value = value;
    this.headers = headers;
  }

  /** The value as UTF-8 text (`null` for a tombstone). Throws
   * `BadRecord` for bytes that are not UTF-8. */
  text() {
    return this.value === null ? null : utf8('value', this.value);
  }

  /** The key as UTF-8 text (`null` when there is no key). Throws
   * `BadRecord` for bytes that are not UTF-8. */
  keyText() {
    return this.key === null ? null : utf8('key', this.key);
  }

  /** The value of the last header called `name`, else `null`. */
  header(name) {
    let found = null;
    for (const [k, v] of this.headers) if (k === name) found = v;
    return found;
  }
}

/** `v` (a BigInt) as a number when it is one exactly (|v| ≤ 2^53 − 1),
 * else unchanged. */
export function exact(v) {
  return v <= BigInt(Number.MAX_SAFE_INTEGER) && v >= BigInt(Number.MIN_SAFE_INTEGER) ? Number(v) : v;
}

function utf8(what, bytes) {
  try {
    return STRICT.decode(bytes);
  } catch (e) {
    throw new BadRecord(`the ${what} is not UTF-8 text`);
  }
}

class Reader {
  constructor(buf) {
    this.buf = buf;
    this.view = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
    this.pos = 0;
  }

  need(n) {
    if (this.pos + n > this.buf.length) {
      throw new WireError(`truncated at byte ${this.pos}: ${n} bytes announced`);
    }
  }

  u32() {
    this.need(4);
    const v = this.view.getUint32(this.pos, true);
    this.pos += 4;
    return v;
  }

  i32() {
    this.need(4);
    const v = this.view.getInt32(this.pos, true);
    this.pos += 4;
    return v;
  }

  // An i64 as a number, or a BigInt beyond what a number holds exactly.
  i64() {
    this.need(8);
    const v = this.view.getBigInt64(this.pos, true);
    this.pos += 8;
    return exact(v);
  }

  take(n) {
    this.need(n);
    const out = this.buf.slice(this.pos, this.pos + n);
    this.pos += n;
    return out;
  }

  optBytes() {
    const n = this.u32();
    return n === NONE ? null : this.take(n);
  }

  text() {
    const n = this.u32();
    this.need(n);
    let s;
    try {
      s = STRICT.decode(this.buf.subarray(this.pos, this.pos + n));
    } catch (e) {
      throw new WireError(`text at byte ${this.pos} is not UTF-8`);
    }
    this.pos += n;
    return s;
  }

  record() {
    const topic = this.text();
    const partition = this.i32();
    const offset = this.i64();
    const timestamp = this.i64();
    this.need(1);
    const kind = this.buf[this.pos++];
    if (kind >= TIMESTAMP_TYPES.length) {
      throw new WireError(`timestamp type ${kind} is not one of ${TIMESTAMP_TYPES.join(', ')}`);
    }
    const key = this.optBytes();
    const value = this.optBytes();
    const headers = [];
    for (let n = this.u32(); n > 0; n--) headers.push([this.text(), this.optBytes()]);
    return new Record(topic, partition, offset, timestamp, TIMESTAMP_TYPES[kind], key, value, headers);
  }
}

/** Decode a `packed-records` buffer (a `Uint8Array`) into `Record`s. */
export function readRecords(buf) {
  const r = new Reader(buf);
  const out = [];
  for (let n = r.u32(); n > 0; n--) out.push(r.record());
  return out;
}

/** Decode a `packed-sink-records` buffer: `[idempotencyKey, Record]` pairs. */
export function readSinkRecords(buf) {
  const r = new Reader(buf);
  const out = [];
  for (let n = r.u32(); n > 0; n--) {
    const key = r.text();
    out.push([key, r.record()]);
  }
  return out;
}

export function asBytes(what, v) {
  if (v === null || v instanceof Uint8Array) return v;
  if (typeof v === 'string') return UTF8.encode(v);
  if (ArrayBuffer.isView(v)) return new Uint8Array(v.buffer, v.byteOffset, v.byteLength);
  if (v instanceof ArrayBuffer) return new Uint8Array(v);
  const got = v === undefined ? 'undefined' : typeof v;
  throw new TypeError(`an output's ${what} must be a Uint8Array, a string or null, not ${got}`);
}

/** A growing little-endian buffer. */
class Writer {
  constructor() {
    this.buf = new Uint8Array(256);
    this.view = new DataView(this.buf.buffer);
    this.len = 0;
  }

  reserve(n) {
    if (this.len + n <= this.buf.length) return;
    let size = this.buf.length * 2;
    while (size < this.len + n) size *= 2;
    const next = new Uint8Array(size);
    next.set(this.buf.subarray(0, this.len));
    this.buf = next;
    this.view = new DataView(next.buffer);
  }

  u32(v) {
    this.reserve(4);
    this.view.setUint32(this.len, v, true);
    this.len += 4;
  }

  i32(v) {
    this.reserve(4);
    this.view.setInt32(this.len, v, true);
    this.len += 4;
  }

  i64(v) {
    this.reserve(8);
    this.view.setBigInt64(this.len, BigInt(v), true);
    this.len += 8;
  }

  u8(v) {
    this.reserve(1);
    this.buf[this.len++] = v;
  }

  bytes(b) {
    this.u32(b.length);
    this.reserve(b.length);
    this.buf.set(b, this.len);
    this.len += b.length;
  }

  optBytes(b) {
    if (b === null) this.u32(NONE);
    else this.bytes(b);
  }

  finish() {
    return this.buf.slice(0, this.len);
  }
}

/** A `packed-outputs` buffer being written (one per map call). */
export class Outputs {
  constructor() {
    this.count = 0;
    this.w = new Writer();
    this.w.u32(0);
  }

  /** Add an output of input `inputIndex`. `key` and `value`: Uint8Array,
   * string (UTF-8) or null; `headers`: `[name, value]` pairs. Throws a
   * `TypeError` for anything else, before writing. */
  push(inputIndex, key, value, headers = []) {
    key = asBytes('key', key);
    value = asBytes('value', value);
    const hs = [];
    for (const [k, v] of headers) {
      if (typeof k !== 'string') {
        throw new TypeError(`an output's header name must be a string, not ${typeof k}`);
      }
      hs.push([UTF8.encode(k), asBytes('header value', v)]);
    }
    const w = this.w;
    w.u32(inputIndex);
    w.optBytes(key);
    w.optBytes(value);
    w.u32(hs.length);
    for (const [k, v] of hs) {
      w.bytes(k);
      w.optBytes(v);
    }
    this.count++;
  }

  /** Where the buffer is now (for `rewind`). */
  mark() {
    return [this.count, this.w.len];
  }

  /** Drop the outputs pushed since `mark`. */
  rewind([count, len]) {
    this.count = count;
    this.w.len = len;
  }

  /** The buffer, its count filled in. */
  finish() {
    this.w.view.setUint32(0, this.count, true);
    return this.w.finish();
  }
}

/** Encode `Record`s as `packed-records` (for tests and tools). */
export function writeRecords(records) {
  const w = new Writer();
  w.u32(records.length);
  for (const r of records) {
    w.bytes(UTF8.encode(r.topic));
    w.i32(r.partition);
    w.i64(r.offset);
    w.i64(r.timestamp);
    w.u8(TIMESTAMP_TYPES.indexOf(r.timestampType));
    w.optBytes(r.key);
    w.optBytes(r.value);
    w.u32(r.headers.length);
    for (const [k, v] of r.headers) {
      w.bytes(UTF8.encode(k));
      w.optBytes(v);
    }
  }
  return w.finish();
}

/** Encode `[idempotencyKey, Record]` pairs as `packed-sink-records` (for
 * tests). */
export function writeSinkRecords(pairs) {
  const w = new Writer();
  w.u32(pairs.length);
  for (const [key, r] of pairs) {
    w.bytes(UTF8.encode(key));
    const one = writeRecords([r]);
    w.reserve(one.length - 4);
    w.buf.set(one.subarray(4), w.len);
    w.len += one.length - 4;
  }
  return w.finish();
}

/** Decode a `packed-outputs` buffer (for tests): objects with
 * `inputIndex`, `key`, `value`, `headers`. */
export function readOutputs(buf) {
  const r = new Reader(buf);
  const out = [];
  for (let n = r.u32(); n > 0; n--) {
    const inputIndex = r.u32();
    const key = r.optBytes();
    const value = r.optBytes();
    const headers = [];
    for (let h = r.u32(); h > 0; h--) headers.push([r.text(), r.optBytes()]);
    out.push({ inputIndex, key, value, headers });
  }
  return out;
}
