"""JSON whose values keep their exact source text: a decimal such as
``999999999999.999998`` or a MySQL zero date passes through a stage byte
for byte, where ``json.loads`` would round the decimal through a float.
The Python counterpart of the Rust SDK's ``json::Object`` and
``RawValue``; parsing is the standard library's (``JSONDecoder.raw_decode``
finds where each value ends)."""

from __future__ import annotations

import json as _json
import re

from . import BadRecord

def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


# NaN and Infinity are not JSON (RFC 8259); the standard library takes them.
# Numbers stay text (the raw values are what is kept), so an integer of
# more than 4,300 digits is not refused by int()'s limit.
_DECODER = _json.JSONDecoder(parse_constant=_no_constant, parse_int=str, parse_float=str)


def _surrogate(s: str) -> bool:
    return any("\ud800" <= c <= "\udfff" for c in s)

_WS = re.compile(r"[ \t\n\r]*")


class JsonError(BadRecord, ValueError):
    """Not JSON, or not the JSON expected: a :class:`sluice_guest.BadRecord`,
    so one left uncaught in a stage rejects that record only."""


def _skip(text: str, i: int) -> int:
    return _WS.match(text, i).end()


def object_fields(source: bytes | str) -> list[tuple[str, str]]:
    """The members of a JSON object, in order: ``(name, raw value text)``.

    Raises :class:`JsonError` (``not JSON: …`` or ``unexpected JSON: …``)
    for bytes that are not UTF-8, text that is not JSON, or JSON that is
    not an object.
    """
    try:
        text = source.decode("utf-8") if isinstance(source, (bytes, bytearray)) else source
    except UnicodeDecodeError as e:
        raise JsonError(f"not JSON: not UTF-8: {e}") from None
    i = _skip(text, 0)
    if not text.startswith("{", i):
        try:
            _DECODER.raw_decode(text, i)
        except ValueError as e:
            raise JsonError(f"not JSON: {e}") from None
        except RecursionError:
            raise JsonError("not JSON here: nested deeper than Python's recursion limit") from None
        raise JsonError(f"unexpected JSON: {kind(text[i:])}, not an object")
    fields = []
    i = _skip(text, i + 1)
    if text.startswith("}", i):
        end = i + 1
    else:
        while True:
            try:
                name, i = _DECODER.raw_decode(text, i)
                if not isinstance(name, str):
                    raise ValueError(f"an object key must be a string, at char {i}")
                if _surrogate(name):
                    raise ValueError(f"a lone surrogate in a name, before char {i}")
                i = _skip(text, i)
                if not text.startswith(":", i):
                    raise ValueError(f"expected ':' at char {i}")
                start = _skip(text, i + 1)
                _, i = _DECODER.raw_decode(text, start)
            except ValueError as e:
                raise JsonError(f"not JSON: {e}") from None
            except RecursionError:
                raise JsonError(f"not JSON here: nested deeper than Python's recursion limit at char {start}") from None
            fields.append((name, text[start:i]))
            i = _skip(text, i)
            if text.startswith(",", i):
                i = _skip(text, i + 1)
                continue
            if text.startswith("}", i):
                end = i + 1
                break
            raise JsonError(f"not JSON: expected ',' or '}}' at char {i}")
    if _skip(text, end) != len(text):
        raise JsonError(f"not JSON: trailing characters at char {_skip(text, end)}")
    return fields


def kind(raw: str) -> str:
    """What a raw JSON value is, for messages: ``an object``, ``an
    array``, ``a string``, ``a number``, ``a boolean`` or ``null``."""
    c = raw.lstrip()[:1]
    return {
        "{": "an object",
        "[": "an array",
        '"': "a string",
        "t": "a boolean",
        "f": "a boolean",
        "n": "null",
    }.get(c, "a number")


def string(raw: str) -> str | None:
    """A raw value that is a JSON string, decoded; ``None`` otherwise. A
    lone surrogate escape is a :class:`JsonError` (serde_json refuses to
    decode one into a string)."""
    if not raw.lstrip().startswith('"'):
        return None
    s = _json.loads(raw)
    if _surrogate(s):
        raise JsonError(f"not JSON: a lone surrogate escape in the string {raw}")
    return s


def write_string(s: str) -> str:
    """``s`` as a JSON string (as raw value text for :func:`write_object`)."""
    return _json.dumps(s, ensure_ascii=False)


def write_object(fields) -> str:
    """``{"name":raw,…}`` from ``(name, raw value text)`` pairs, with no
    spaces (as the Rust SDK's ``json::write`` prints an ``Object``)."""
    return "{" + ",".join(f"{_json.dumps(n, ensure_ascii=False)}:{v}" for n, v in fields) + "}"
