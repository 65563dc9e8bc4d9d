// JSON whose values keep their exact source text: a decimal such as
// `999999999999.999998` or a MySQL zero date passes through a stage byte
// for byte, where `JSON.parse` would round the decimal through a double.
// The JavaScript counterpart of the Rust SDK's `json::Object` and
// `RawValue`. The engine's `JSON.parse` (RFC 8259's grammar, native code)
// decides what is JSON; the members' text is then found by a scanner that
// jumps over strings with `indexOf` (the component's engine interprets
// JavaScript, so native calls are what make it fast).
// As serde_json does for a `RawValue`, a value may hold lone surrogate
// escapes; member names may not. Nesting deeper than `JSON.parse` takes
// in the component (its stack) is a bad record too.

import { BadRecord } from './errors.js';

/** Not JSON, or not the JSON expected: a `BadRecord`, so one left
 * uncaught in a stage rejects that record only. */
export class JsonError extends BadRecord {
  constructor(message) {
    super(message);
    this.name = 'JsonError';
  }
}

const STRICT = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

function asText(source) {
  if (typeof source === 'string') return source;
  try {
    return STRICT.decode(source);
  } catch {
    throw new JsonError('not JSON: not UTF-8');
  }
}

const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

// The scanners below run on text `JSON.parse` accepted, so they only find
// where things end. `indexOf` (native) jumps over strings; the
// interpreter runs a loop body per character only inside nested
// containers and numbers.

function skipWs(t, i) {
  for (;;) {
    const c = t.charCodeAt(i);
    if (c !== 0x20 && c !== 0x0a && c !== 0x0d && c !== 0x09) return i;
    i += 1;
  }
}

// The end of the string whose opening quote is at `i`.
function skipString(t, i) {
  let j = t.indexOf('"', i + 1);
  while (t.charCodeAt(j - 1) === 0x5c) {
    let k = j - 1;
    while (t.charCodeAt(k - 1) === 0x5c) k -= 1;
    if ((j - k) % 2 === 0) break; // an even run of backslashes escapes itself
    j = t.indexOf('"', j + 1);
  }
  return j + 1;
}

// An object or an array with no container inside, matched in one native
// call (most values of change events are such rows).
const FLAT = /\{(?:[^{}[\]"]|"[^"\\]*(?:\\.[^"\\]*)*")*\}|\[(?:[^{}[\]"]|"[^"\\]*(?:\\.[^"\\]*)*")*\]/y;

// The end of the value starting at `i`.
function skipValue(t, i) {
  const c = t.charCodeAt(i);
  if (c === 0x22) return skipString(t, i);
  if (c === 0x7b || c === 0x5b) {
    FLAT.lastIndex = i;
    if (FLAT.test(t)) return FLAT.lastIndex;
    let depth = 0;
    for (let j = i; ; j += 1) {
      const d = t.charCodeAt(j);
      if (d === 0x22) {
        j = skipString(t, j) - 1;
      } else if (d === 0x7b || d === 0x5b) {
        depth += 1;
      } else if ((d === 0x7d || d === 0x5d) && --depth === 0) {
        return j + 1;
      }
    }
  }
  let j = i + 1; // a number or a literal: up to a delimiter
  for (;;) {
    const d = t.charCodeAt(j);
    if (d === 0x2c || d === 0x7d || d === 0x5d || d === 0x20 || d === 0x0a || d === 0x0d || d === 0x09 || j >= t.length) {
      return j;
    }
    j += 1;
  }
}

/**
 * The members of a JSON object, in order: `[name, raw value text]` pairs
 * (a repeated name appears each time). `source`: a string or UTF-8 bytes
 * (a Uint8Array). Throws `JsonError` (`not JSON: …` or `unexpected JSON:
 * …`) for bytes that are not UTF-8, text that is not JSON (the engine's
 * `JSON.parse` decides), JSON that is not an object, or a member name
 * with a lone surrogate escape.
 */
export function objectFields(source) {
  const t = asText(source);
  let parsed;
  try {
    parsed = JSON.parse(t);
  } catch (e) {
    throw new JsonError(`not JSON: ${e.message}`);
  }
  if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) {
    throw new JsonError(`unexpected JSON: ${kind(t)}, not an object`);
  }
  const fields = [];
  let i = skipWs(t, skipWs(t, 0) + 1);
  if (t.charCodeAt(i) === 0x7d) return fields;
  for (;;) {
    const nameEnd = skipString(t, i);
    const start = skipWs(t, skipWs(t, nameEnd) + 1); // past the ':'
    const end = skipValue(t, start);
    fields.push([name(t.slice(i + 1, nameEnd - 1)), t.slice(start, end)]);
    i = skipWs(t, end);
    if (t.charCodeAt(i) === 0x7d) return fields;
    i = skipWs(t, i + 1); // past the ','
  }
}

// A member name from the text between its quotes (a slice costs the
// interpreter about as much as 15 loop steps: one per name).
function name(inner) {
  if (!inner.includes('\\')) return inner;
  const decoded = JSON.parse(`"${inner}"`);
  if (inner.includes('\\u') && LONE_SURROGATE.test(decoded)) {
    throw new JsonError(`not JSON: a lone surrogate escape in the name "${inner}"`);
  }
  return decoded;
}

/** What a raw JSON value is, for messages: `an object`, `an array`, `a
 * string`, `a boolean`, `null` or `a number`. */
export function kind(raw) {
  const c = raw.trimStart()[0];
  return { '{': 'an object', '[': 'an array', '"': 'a string', t: 'a boolean', f: 'a boolean', n: 'null' }[c] ?? 'a number';
}

/** A raw value that is a JSON string, decoded; `null` otherwise. A lone
 * surrogate escape is a `JsonError` (serde_json refuses to decode one
 * into a string). */
export function string(raw) {
  if (!raw.trimStart().startsWith('"')) return null;
  const s = JSON.parse(raw);
  if (raw.includes('\\u') && LONE_SURROGATE.test(s)) {
    throw new JsonError(`not JSON: a lone surrogate escape in the string ${raw}`);
  }
  return s;
}

/** `s` as a JSON string (raw value text for `writeObject`). */
export function writeString(s) {
  return JSON.stringify(s);
}

/** `{"name":raw,…}` from `[name, raw value text]` pairs, with no spaces
 * (as the Rust SDK's `json::write` prints an `Object`). */
export function writeObject(fields) {
  return `{${fields.map(([n, v]) => `${JSON.stringify(n)}:${v}`).join(',')}}`;
}
