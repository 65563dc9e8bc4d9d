// Run stages natively under Node.js, without Kafka or a component: for a
// plugin's own unit tests (`node --test`). Records go through the same
// packed format and the same loop as inside the component.

import { Config, mapCall } from './index.js';
import { NativeHost, install } from './host.js';
import { Record, readOutputs, writeRecords } from './wire.js';

export { Record };

/** An instance of stage class `Stage` made with `config` (an object of
 * strings), natively: a sink's SQL calls then fail (no connection). */
export function make(Stage, config = {}) {
  install(new NativeHost(config));
  return new Stage(new Config());
}

/** Run map stage class `Stage` (made once, with `config`) over `records`
 * in one call: `{ outputs: [{inputIndex, key, value, headers}], rejected:
 * [[index, message]] }` (keys and values as Uint8Array or null). */
export function mapRecords(Stage, records, config = {}) {
  const stage = make(Stage, config);
  const [packed, rejected] = mapCall(stage, writeRecords(records));
  return { outputs: readOutputs(packed), rejected };
}

const UTF8 = new TextEncoder();
const bytes = (v) => (typeof v === 'string' ? UTF8.encode(v) : v);

/** `mapRecords` over records of topic `test`, partition 0, offsets 0, 1,
 * …, with these values (strings, Uint8Array or null) and, if given, these
 * keys. */
export function mapValues(Stage, values, config = {}, keys = null) {
  const records = values.map(
    (v, i) => new Record('test', 0, i, 0, 'not-available', keys ? bytes(keys[i]) : null, bytes(v), []),
  );
  return mapRecords(Stage, records, config);
}

/** UTF-8 bytes as a string (for assertions); `null` stays `null`. */
export function text(b) {
  return b === null ? null : new TextDecoder().decode(b);
}
