"""Run stages natively, without Kafka or a component: for the plugin's own
unit tests (``python -m unittest``). Records go through the same packed
format and the same loop as inside the component."""

from __future__ import annotations

from dataclasses import dataclass, field

from . import Config, _host, map_call
from .wire import Record, read_outputs, write_records


@dataclass
class Output:
    """One output of a map call."""

    input_index: int
    key: bytes | None
    value: bytes | None
    headers: list = field(default_factory=list)


@dataclass
class Mapped:
    """What :func:`map_values` and :func:`map_records` return."""

    outputs: list[Output]
    #: ``(input index, message)`` of each rejected record.
    rejected: list[tuple[int, str]]


def make(stage, config: dict[str, str] | None = None):
    """An instance of stage class ``stage`` made with ``config``, natively
    (a sink's SQL calls then fail: no connection is granted)."""
    _host.install(_host.NativeHost(config))
    return stage(Config())


def map_records(stage, records: list[Record], config: dict[str, str] | None = None) -> Mapped:
    """Run map stage class ``stage`` (made once, with ``config``) over
    ``records`` in one call."""
    instance = make(stage, config)
    packed, rejected = map_call(instance, write_records(records))
    return Mapped([Output(*o) for o in read_outputs(packed)], rejected)


def map_values(stage, values, config: dict[str, str] | None = None, keys=None) -> Mapped:
    """:func:`map_records` over records of topic ``test``, partition 0,
    offsets 0, 1, …, with these values (bytes, str or ``None``) and,
    if given, these keys."""
    keys = list(keys) if keys is not None else [None] * len(values)
    as_bytes = lambda v: v.encode() if isinstance(v, str) else v  # noqa: E731
    records = [
        Record("test", 0, i, 0, "not-available", as_bytes(k), as_bytes(v), [])
        for i, (k, v) in enumerate(zip(keys, values))
    ]
    return map_records(stage, records, config)
