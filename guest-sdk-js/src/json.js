// JSON whose values keep their exact source text: a decimal such as
// `999999999999.999998` or a MySQL zero date passes through a stage byte
// for byte, where `JSON.parse` would round the decimal through a double.
// The JavaScript counterpart of the Rust SDK's `json::Object` and
// `RawValue`. The grammar is RFC 8259's. As serde_json does for a
// `RawValue`, a value is checked for its grammar only: a lone surrogate
// escape inside it and any depth of nesting are kept as they are; member
// names must be valid strings (no lone surrogate escape).

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

function isWs(c) {
  return c === 0x20 || c === 0x09 || c === 0x0a || c === 0x0d;
}

function skipWs(t, i) {
  while (i < t.length && isWs(t.charCodeAt(i))) i++;
  return i;
}

function fail(what, i) {
  throw new JsonError(`not JSON: ${what} at char ${i}`);
}

const HEX = /^[0-9a-fA-F]{4}$/;

// The end of the string starting at `i` (a `"`); with `surrogates`,
// a lone surrogate escape is an error (for member names).
function skipString(t, i, surrogates = false) {
  let pendingHigh = false;
  for (let j = i + 1; j < t.length; j++) {
    const c = t.charCodeAt(j);
    if (c === 0x22) {
      if (surrogates && pendingHigh) fail('a lone surrogate escape', j);
      return j + 1;
    }
    if (c < 0x20) fail('a control character in a string', j);
    if (c !== 0x5c) {
      if (surrogates && pendingHigh) fail('a lone surrogate escape', j);
      continue;
    }
    const e = t[j + 1];
    if (e === 'u') {
      const hex = t.slice(j + 2, j + 6);
      if (!HEX.test(hex)) fail('a bad \\u escape', j);
      const u = parseInt(hex, 16);
      if (surrogates) {
        if (u >= 0xdc00 && u <= 0xdfff) {
          if (!pendingHigh) fail('a lone surrogate escape', j);
          pendingHigh = false;
        } else if (pendingHigh) {
          fail('a lone surrogate escape', j);
        } else if (u >= 0xd800 && u <= 0xdbff) {
          pendingHigh = true;
        }
      }
      j += 5;
    } else if (e !== undefined && '"\\/bfnrt'.includes(e)) {
      if (surrogates && pendingHigh) fail('a lone surrogate escape', j);
      j += 1;
    } else {
      fail('a bad escape', j);
    }
  }
  fail('an unterminated string', i);
}

const NUMBER = /-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?/y;

// The end of a scalar (string, literal or number) starting at `i`.
function skipScalar(t, i) {
  if (t[i] === '"') return skipString(t, i);
  for (const word of ['true', 'false', 'null']) {
    if (t.startsWith(word, i)) return i + word.length;
  }
  NUMBER.lastIndex = i;
  if (NUMBER.test(t)) return NUMBER.lastIndex;
  fail(i < t.length ? 'expected a value' : 'unexpected end', i);
}

// The end of the value starting at `i` (whitespace skipped before). A
// loop with a stack of open containers, so any depth is checked.
function skipValue(t, i) {
  const open = [];
  let j = i;
  for (;;) {
    // A value starts at j.
    if (t[j] === '{' || t[j] === '[') {
      const close = t[j] === '{' ? '}' : ']';
      j = skipWs(t, j + 1);
      if (t[j] === close) {
        j += 1;
      } else {
        open.push(close);
        if (close === '}') j = member(t, j);
        continue;
      }
    } else {
      j = skipScalar(t, j);
    }
    // A value ended at j: close containers or go to the next element.
    for (;;) {
      if (open.length === 0) return j;
      j = skipWs(t, j);
      const close = open[open.length - 1];
      if (t[j] === ',') {
        j = skipWs(t, j + 1);
        if (close === '}') j = member(t, j);
        break;
      }
      if (t[j] !== close) fail(`expected ',' or '${close}'`, j);
      open.pop();
      j += 1;
    }
  }
}

// Past an object member's name and colon at `j`: where its value starts.
function member(t, j) {
  if (t[j] !== '"') fail('expected a name', j);
  j = skipWs(t, skipString(t, j));
  if (t[j] !== ':') fail("expected ':'", j);
  return skipWs(t, j + 1);
}

function asText(source) {
  if (typeof source === 'string') return source;
  try {
    return STRICT.decode(source);
  } catch {
    throw new JsonError('not JSON: not UTF-8');
  }
}

/**
 * The members of a JSON object, in order: `[name, raw value text]` pairs.
 * `source`: a string or UTF-8 bytes (a Uint8Array). Throws `JsonError`
 * (`not JSON: …` or `unexpected JSON: …`) for bytes that are not UTF-8,
 * text that is not JSON, or JSON that is not an object.
 */
export function objectFields(source) {
  const t = asText(source);
  let i = skipWs(t, 0);
  if (t[i] !== '{') {
    const end = skipWs(t, skipValue(t, i));
    if (end !== t.length) fail('trailing characters', end);
    throw new JsonError(`unexpected JSON: ${kind(t.slice(i))}, not an object`);
  }
  const fields = [];
  i = skipWs(t, i + 1);
  if (t[i] === '}') {
    i += 1;
  } else {
    for (;;) {
      if (t[i] !== '"') fail('expected a name', i);
      const nameEnd = skipString(t, i, true);
      const name = JSON.parse(t.slice(i, nameEnd));
      i = skipWs(t, nameEnd);
      if (t[i] !== ':') fail("expected ':'", i);
      const start = skipWs(t, i + 1);
      i = skipValue(t, start);
      fields.push([name, t.slice(start, i)]);
      i = skipWs(t, i);
      if (t[i] === ',') {
        i = skipWs(t, i + 1);
        continue;
      }
      if (t[i] === '}') {
        i += 1;
        break;
      }
      fail("expected ',' or '}'", i);
    }
  }
  const end = skipWs(t, i);
  if (end !== t.length) fail('trailing characters', end);
  return fields;
}

/** What a raw JSON value is, for messages: `an object`, `an array`, `a
 * string`, `a boolean`, `null` or `a number`. */
export function kind(raw) {
  const c = raw.trimStart()[0];
  return { '{': 'an object', '[': 'an array', '"': 'a string', t: 'a boolean', f: 'a boolean', n: 'null' }[c] ?? 'a number';
}

/** A raw value that is a JSON string, decoded; `null` otherwise. */
export function string(raw) {
  return raw.trimStart().startsWith('"') ? JSON.parse(raw) : null;
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
