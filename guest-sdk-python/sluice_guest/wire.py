"""The packed batch formats of ``wit/plugin.wit`` (``packed-records``,
``packed-outputs``, ``packed-sink-records``), read and written in pure
Python. All integers little-endian; ``bytes`` is a u32 length then the
bytes; ``opt-bytes`` is a u32 length, or 0xFFFF_FFFF for none.

Plugin authors never see these: the SDK hands stages ``Record`` objects.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

NONE = 0xFFFF_FFFF

_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
_RECORD_HEAD = struct.Struct("<iqqB")  # partition, offset, timestamp, timestamp type

#: The WIT ``timestamp-type`` enum, by its wire value.
TIMESTAMP_TYPES = ("not-available", "create-time", "log-append-time")


class WireError(ValueError):
    """A packed buffer that does not follow the layout (a host bug)."""


@dataclass(frozen=True)
class Record:
    """A Kafka record as a stage sees it.

    ``key`` and ``value`` are ``bytes`` or ``None``: a ``value`` of ``None``
    is a tombstone (a delete marker for compacted topics), ``b""`` an empty
    value. ``timestamp`` is ms since the Unix epoch (0 when
    ``timestamp_type`` is ``"not-available"``). ``headers`` is a list of
    ``(key, value)`` pairs, the value ``bytes`` or ``None``.
    """

    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: str
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)

    def text(self) -> str | None:
        """The value as UTF-8 text (``None`` for a tombstone).

        Raises ``UnicodeDecodeError`` for bytes that are not UTF-8; a map
        or sink stage may let it propagate as a bad record by catching it,
        see ``sluice_guest.BadRecord``.
        """
        return None if self.value is None else self.value.decode("utf-8")

    def key_text(self) -> str | None:
        """The key as UTF-8 text (``None`` when there is no key)."""
        return None if self.key is None else self.key.decode("utf-8")

    def header(self, name: str) -> bytes | None:
        """The value of the last header called ``name``, else ``None``."""
        found = None
        for k, v in self.headers:
            if k == name:
                found = v
        return found


class _Reader:
    def __init__(self, buf: bytes):
        self.buf = memoryview(buf)
        self.pos = 0

    def u32(self) -> int:
        try:
            (v,) = _U32.unpack_from(self.buf, self.pos)
        except struct.error as e:
            raise WireError(f"truncated at byte {self.pos}: {e}") from None
        self.pos += 4
        return v

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.buf):
            raise WireError(f"truncated at byte {self.pos}: {n} bytes announced")
        out = bytes(self.buf[self.pos : end])
        self.pos = end
        return out

    def bytes_(self) -> bytes:
        return self.take(self.u32())

    def opt_bytes(self) -> bytes | None:
        n = self.u32()
        return None if n == NONE else self.take(n)

    def text(self) -> str:
        return self.bytes_().decode("utf-8")

    def record(self) -> Record:
        topic = self.text()
        try:
            partition, offset, timestamp, kind = _RECORD_HEAD.unpack_from(self.buf, self.pos)
        except struct.error as e:
            raise WireError(f"truncated at byte {self.pos}: {e}") from None
        self.pos += _RECORD_HEAD.size
        key = self.opt_bytes()
        value = self.opt_bytes()
        headers = [(self.text(), self.opt_bytes()) for _ in range(self.u32())]
        if kind >= len(TIMESTAMP_TYPES):
            raise WireError(f"timestamp type {kind} is not one of {TIMESTAMP_TYPES}")
        return Record(topic, partition, offset, timestamp, TIMESTAMP_TYPES[kind], key, value, headers)


def read_records(buf: bytes) -> list[Record]:
    """Decode a ``packed-records`` buffer."""
    r = _Reader(buf)
    return [r.record() for _ in range(r.u32())]


def read_sink_records(buf: bytes) -> list[tuple[str, Record]]:
    """Decode a ``packed-sink-records`` buffer: (idempotency key, record)."""
    r = _Reader(buf)
    out = []
    for _ in range(r.u32()):
        key = r.text()
        out.append((key, r.record()))
    return out


def _put_bytes(out: bytearray, b: bytes) -> None:
    out += _U32.pack(len(b))
    out += b


def _put_opt(out: bytearray, b: bytes | None) -> None:
    if b is None:
        out += _U32.pack(NONE)
    else:
        _put_bytes(out, b)


def _as_bytes(what: str, v: bytes | bytearray | str | None) -> bytes | None:
    if v is None or isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode("utf-8")
    if isinstance(v, (bytearray, memoryview)):
        return bytes(v)
    raise TypeError(f"an output's {what} must be bytes, str or None, not {type(v).__name__}")


class Outputs:
    """A ``packed-outputs`` buffer being written (one per map call)."""

    def __init__(self) -> None:
        self.count = 0
        self.buf = bytearray(4)

    def push(self, input_index: int, key, value, headers=()) -> None:
        """Add an output of input ``input_index``. ``key`` and ``value``:
        bytes, str (UTF-8) or ``None``; ``headers``: ``(name, value)``
        pairs."""
        key = _as_bytes("key", key)
        value = _as_bytes("value", value)
        hs = []
        for k, v in headers:
            if not isinstance(k, str):
                raise TypeError(f"an output's header name must be str, not {type(k).__name__}")
            hs.append((k, _as_bytes("header value", v)))
        out = self.buf
        out += _U32.pack(input_index)
        _put_opt(out, key)
        _put_opt(out, value)
        out += _U32.pack(len(hs))
        for k, v in hs:
            _put_bytes(out, k.encode("utf-8"))
            _put_opt(out, v)
        self.count += 1

    def mark(self) -> tuple[int, int]:
        """Where the buffer is now (for :meth:`rewind`)."""
        return (self.count, len(self.buf))

    def rewind(self, mark: tuple[int, int]) -> None:
        """Drop the outputs pushed since ``mark``."""
        self.count, n = mark
        del self.buf[n:]

    def finish(self) -> bytes:
        """The buffer, its count filled in."""
        _U32.pack_into(self.buf, 0, self.count)
        return bytes(self.buf)


def write_records(records: list[Record]) -> bytes:
    """Encode ``records`` as ``packed-records`` (for tests and tools)."""
    out = bytearray(_U32.pack(len(records)))
    for r in records:
        _put_bytes(out, r.topic.encode("utf-8"))
        out += _RECORD_HEAD.pack(r.partition, r.offset, r.timestamp, TIMESTAMP_TYPES.index(r.timestamp_type))
        _put_opt(out, r.key)
        _put_opt(out, r.value)
        out += _U32.pack(len(r.headers))
        for k, v in r.headers:
            _put_bytes(out, k.encode("utf-8"))
            _put_opt(out, v)
    return bytes(out)


def read_outputs(buf: bytes) -> list[tuple[int, bytes | None, bytes | None, list]]:
    """Decode a ``packed-outputs`` buffer (for tests):
    (input index, key, value, headers)."""
    r = _Reader(buf)
    out = []
    for _ in range(r.u32()):
        i = r.u32()
        key = r.opt_bytes()
        value = r.opt_bytes()
        headers = [(r.text(), r.opt_bytes()) for _ in range(r.u32())]
        out.append((i, key, value, headers))
    return out
