// Write Sluice map and sink stages in JavaScript.
//
// A plugin is an ES module (`app.js`) that exports a map stage, a sink
// stage or both, built into a WebAssembly component with ComponentizeJS
// against the contract `sluice:plugin@0.2.4` (`wit/plugin.wit`):
//
//     import * as sluice from 'sluice-guest';
//
//     class Upper extends sluice.Mapper {
//       constructor(config) {            // once per instance
//         super(config);
//         this.suffix = config.get('suffix', '');
//       }
//       map(record, emit) {
//         if (record.value === null) throw new sluice.BadRecord('tombstone');
//         emit(record.key, record.text().toUpperCase() + this.suffix);
//       }
//     }
//
//     export const mapper = sluice.exportMap(Upper);   // the name the contract needs
//
// Build it with `npx sluice-guest-build app.js -o upper.wasm` and run it
// with `host test --plugin upper.wasm --input FILE` or `host run`.
//
// Errors, as in the Rust and Python SDKs: throw `BadRecord` to reject one
// record (it goes to the pipeline's `--on-error`), `Retryable` to have the
// host retry the call, `Fatal` to stop the batch uncommitted. Anything
// else thrown is a trap, like a Rust panic: the host discards the instance
// and retries on a fresh one, and under `--on-error dlq` narrows it down
// to the records that throw it; the SDK prints the error and its stack
// into the host's log first. An `SqlError` left uncaught in a sink stage
// fails the part, as a fatal error.

import { BadRecord, Fatal, Retryable, StageError } from './errors.js';
import { host } from './host.js';
import * as log from './log.js';
import * as sql from './sql.js';
import { Outputs, Record, WireError, exact, readRecords, readSinkRecords } from './wire.js';

export { BadRecord, Fatal, Retryable, StageError, Record, log, sql };

/** The contract this SDK is built for (`wit/plugin.wit`). */
export const CONTRACT = 'sluice:plugin@0.2.4';

/** Marks what `exportMap` / `exportSink` return (`'map'`, `'sink'`), so
 * the build can check a stage is exported under the contract's name. */
export const STAGE = Symbol.for('sluice-guest.stage');

/** Marks the prototypes of `Mapper` and `Sink` (`'map'`, `'sink'`), so the
 * build can tell a stage class that is never exported as a stage. */
export const STAGE_CLASS = Symbol.for('sluice-guest.stage-class');

/**
 * The pipeline's `--config KEY=VALUE` pairs (every plugin of a pipeline
 * sees them all, so keys a stage does not know are another's).
 */
export class Config {
  /** The value of `key`, else `fallback` (default `null`). */
  get(key, fallback = null) {
    return host().configGet(key) ?? fallback;
  }

  /** `key` as an integer (a JavaScript number); `Fatal` naming it when
   * it is not one. */
  int(key, fallback = null) {
    const v = host().configGet(key);
    if (v === null) return fallback;
    const t = v.trim();
    if (!/^[+-]?\d+$/.test(t) || !Number.isSafeInteger(Number(t))) {
      throw new Fatal(`config \`${key}\` = \`${v}\` is not an integer`);
    }
    return Number(t);
  }

  /** `key` as `true`/`false` (also 1/0, yes/no, on/off). */
  bool(key, fallback = null) {
    const v = host().configGet(key);
    if (v === null) return fallback;
    const t = v.trim().toLowerCase();
    if (['true', '1', 'yes', 'on'].includes(t)) return true;
    if (['false', '0', 'no', 'off'].includes(t)) return false;
    throw new Fatal(`config \`${key}\` = \`${v}\` is not true or false`);
  }

  /** The value of `key`; `Fatal` naming it when missing. */
  require(key) {
    const v = host().configGet(key);
    if (v === null) throw new Fatal(`config \`${key}\` is required (--config ${key}=…)`);
    return v;
  }

  /** Every pair, as an object. */
  all() {
    return Object.fromEntries(host().configAll());
  }
}

/** A map stage: extend it, take the `Config` in the constructor and
 * implement `map(record, emit)`. */
export class Mapper {
  constructor(config) {}

  /** Turn `record` into zero or more outputs: call `emit(key, value,
   * headers)` once per output, `key` and `value` a Uint8Array, a string
   * (UTF-8) or `null` (a `null` value is a tombstone), `headers` optional
   * `[name, value]` pairs. Outputs of one record keep their order; the
   * n-th (n ≥ 1) gets idempotency key `topic/partition/offset#n`. No
   * output counts the record as filtered. */
  map(record, emit) {
    throw new Fatal(`${this.constructor.name} does not implement map(record, emit)`);
  }
}

/** One partition's range of a batch, or a consecutive part of it, as a
 * sink's `open` sees it: `topic`, `partition`, `startOffset`, `endOffset`
 * (half-open; numbers, or BigInt beyond ±2^53), `batchId`, `epoch`
 * (BigInt), `queryId`. */
export class Part {
  constructor(ctx) {
    this.topic = ctx.topic;
    this.partition = ctx.partition;
    this.startOffset = exact(BigInt(ctx.startOffset));
    this.endOffset = exact(BigInt(ctx.endOffset));
    this.batchId = ctx.batch.batchId;
    this.epoch = ctx.batch.epoch;
    this.queryId = ctx.batch.queryId;
  }
}

/** A record handed to a sink: `record` (the mapped key, value and
 * headers, with the source's topic, partition and offset) and its
 * `idempotencyKey` (`topic/partition/offset`, `…#n` for a record's n-th
 * further output), the same across re-runs. */
export class SinkRecord {
  constructor(idempotencyKey, record) {
    this.idempotencyKey = idempotencyKey;
    this.record = record;
  }
}

/** A sink stage: extend it and implement `write(record)` (or
 * `writeChunk(records)`); `init`, `open` and `close` have defaults. */
export class Sink {
  constructor(config) {}

  /** Once per instance, before its first `open` and inside that part's
   * transaction: create tables here (`CREATE TABLE IF NOT EXISTS`). Runs
   * again on the fresh instance after a failed part. */
  init() {}

  /** Begin a part; return `Sink.ALREADY_APPLIED` when the whole part is
   * applied already (a sink that tracks its own progress). */
  open(part) {}

  /** Write one record. */
  write(record) {
    throw new Fatal(`${this.constructor.name} does not implement write(record) or writeChunk(records)`);
  }

  /** Write what one host call carries; the default calls `write` per
   * record. To reject one record of the chunk, throw `new
   * BadRecord('…', i)` with its position. */
  writeChunk(records) {
    records.forEach((r, i) => {
      try {
        this.write(r);
      } catch (e) {
        if (e instanceof BadRecord && e.index === null) e.index = i;
        throw e;
      }
    });
  }

  /** End the part (with the SQL capability, the host commits). */
  close() {}
}

/** Return it from `Sink.open` when the whole part is applied already. */
Sink.ALREADY_APPLIED = 'already-applied';
Mapper.prototype[STAGE_CLASS] = 'map';
Sink.prototype[STAGE_CLASS] = 'sink';

/** `result` of stage method `what`, refused when it is a promise: the
 * host's calls are synchronous, so an `async` method's work (and its
 * errors) would be lost. */
function sync(result, what) {
  if (result !== null && typeof result === 'object' && typeof result.then === 'function') {
    throw new TypeError(`${what} returned a promise: stage methods must be synchronous (not async)`);
  }
  return result;
}

/**
 * One map call: `packed-records` in, `packed-outputs` and the rejected
 * records `[index, message]` out (shared by the component export and
 * `sluice-guest/testing`).
 */
export function mapCall(stage, records) {
  const outputs = new Outputs();
  let index = 0;
  const emit = (key, value, headers = []) => outputs.push(index, key, value, headers);
  const rejected = [];
  const all = readRecords(records);
  for (; index < all.length; index++) {
    const mark = outputs.mark();
    try {
      sync(stage.map(all[index], emit), 'map');
    } catch (e) {
      if (!(e instanceof BadRecord)) throw e;
      outputs.rewind(mark); // a rejected record has no outputs
      rejected.push([index, e.message]);
    }
  }
  return [outputs.finish(), rejected];
}

/** The stage object, made with the pipeline's config. A `Fatal` or
 * `Retryable` from its constructor is that stage error, a `BadRecord` a
 * fatal one naming the stage (as `new` returning an error in the Rust
 * SDK); anything else thrown is a trap (as a panic in `new`). */
export function make(Stage, what) {
  try {
    return new Stage(new Config());
  } catch (e) {
    if (e instanceof BadRecord) throw new Fatal(`${what} init: ${e.message}`);
    throw e;
  }
}

/** A SpiderMonkey stack frame (`fn@plugin.js:729:9`) as `fn (app.js:27)`,
 * through the line table `sluice-guest-build` appends to the bundle;
 * `null` for a frame outside the bundle (the generated bindings). */
export function frame(line, table = globalThis.__sluiceGuestLines) {
  const m = /^(.*)@(.*):(\d+):(\d+)$/.exec(line);
  if (m === null) return null;
  const [, fn, file, row] = m;
  const at = table && file.endsWith('plugin.js') ? table.lines[Number(row)] : undefined;
  if (!at) return table ? null : `${fn || '<anonymous>'} (${file}:${row})`;
  return `${fn || '<anonymous>'} (${table.sources[at[0]]}:${at[1]})`;
}

/** `e` as the WIT `stage-error` to throw from an export, or a trap: an
 * error the stage did not throw on purpose is printed to stderr as
 * `sluice-guest: uncaught TypeError: …` and its stack (`    at fn
 * (app.js:27)`), which the host puts into its message and log, and thrown
 * on, which makes the call trap. */
function stageError(e, what) {
  if (e instanceof Retryable) return { tag: 'retryable', val: e.message };
  if (e instanceof Fatal) return { tag: 'fatal', val: e.message };
  if (e instanceof sql.SqlError) return { tag: 'fatal', val: `sql: ${e}` };
  if (e instanceof WireError) return { tag: 'fatal', val: `malformed packed batch from the host: ${e.message}` };
  if (e instanceof BadRecord) return { tag: 'fatal', val: `bad record from ${what}: ${e.message}` };
  let head;
  try {
    head = e instanceof Error ? `${e.name}: ${e.message}` : `${typeof e} thrown: ${String(e)}`;
  } catch {
    head = `${typeof e} thrown`;
  }
  const stack = e instanceof Error && typeof e.stack === 'string' ? e.stack : '';
  // At most 10 frames: the host keeps the last 2 KiB of the guest's stderr.
  const frames = stack.split('\n').map((l) => frame(l)).filter((f) => f !== null).slice(0, 10);
  console.error([`sluice-guest: uncaught ${head} (in ${what})`, ...frames.map((f) => `    at ${f}`)].join('\n'));
  // A fresh error makes the call trap: the thrown value itself might look
  // like a WIT stage-error to the bindings (an object with `tag` and
  // `val`), and reject records that are not bad.
  return new Error(`uncaught in ${what}: ${head}`);
}

/**
 * The object a plugin exports as its map stage (`export const mapper =
 * exportMap(MyMapper)`). One `Stage` object is made per component
 * instance, on the first call, with the pipeline's config.
 */
export function exportMap(Stage) {
  let stage = null;
  return {
    [STAGE]: 'map',
    map(ctx, records) {
      try {
        if (stage === null) stage = make(Stage, 'map stage');
        const [outputs, rejected] = mapCall(stage, records);
        return { outputs, rejected: rejected.map(([index, message]) => ({ index, message })) };
      } catch (e) {
        throw stageError(e, 'map');
      }
    },
  };
}

/**
 * The object a plugin exports as its sink stage (`export const sink =
 * exportSink(MySink)`). One `Stage` object is made per component
 * instance, on its first `open`; its `init` runs then, inside that part's
 * transaction.
 */
export function exportSink(Stage) {
  let stage = null;
  return {
    [STAGE]: 'sink',
    open(ctx) {
      try {
        if (stage === null) {
          const s = make(Stage, 'sink stage');
          try {
            sync(s.init(), 'init');
          } catch (e) {
            if (e instanceof BadRecord) throw new Fatal(`sink stage init: ${e.message}`);
            throw e;
          }
          stage = s;
        }
        return sync(stage.open(new Part(ctx)), 'open') === Sink.ALREADY_APPLIED ? 'already-applied' : 'proceed';
      } catch (e) {
        throw stageError(e, 'open');
      }
    },

    write(records) {
      let chunk;
      try {
        if (stage === null) throw new Fatal('write before a successful open (a host bug)');
        chunk = readSinkRecords(records).map(([k, r]) => new SinkRecord(k, r));
        sync(stage.writeChunk(chunk), 'writeChunk');
      } catch (e) {
        if (e instanceof BadRecord) {
          const index = e.index ?? (chunk.length === 1 ? 0 : null);
          if (!Number.isInteger(index) || !(index >= 0 && index < chunk.length)) {
            // Rejecting the wrong record would dead-letter a good one.
            throw {
              tag: 'fatal',
              val: `a bad record from writeChunk without a valid index (new BadRecord(message, i)): ${e.message}`,
            };
          }
          throw { tag: 'bad-record', val: { index, message: e.message } };
        }
        throw stageError(e, 'write');
      }
    },

    close() {
      try {
        if (stage === null) throw new Fatal('close before a successful open (a host bug)');
        sync(stage.close(), 'close');
      } catch (e) {
        throw stageError(e, 'close');
      }
    },
  };
}
