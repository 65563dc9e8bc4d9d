"""The host's kafka capability, for sink stages (``sluice:plugin/kafka``,
contract 0.2.4): produce records to the topics the pipeline names with
``host run --output-topic``.

The host keeps what a range sent until the range's ``close`` succeeds,
then produces it in the order sent: exactly once in the batch's Kafka
transaction (no ``--sink-db``), or at-least-once, acknowledged before the
range is recorded applied, each record carrying its idempotency key in the
header ``sluice-idempotency-key``. A range written again drops what its
failed attempt sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ._host import host
from .wire import _as_bytes


@dataclass
class OutputRecord:
    """One record to produce. ``topic``: one of the pipeline's output
    topics; ``idempotency_key``: the key of the input it comes from
    (``sink_record.idempotency_key``, plus ``#n`` for its n-th further
    record); ``key`` and ``value``: bytes, str (UTF-8) or ``None`` (a null
    key; a tombstone); ``headers``: ``(name, value)`` pairs; ``partition``:
    ``None`` for the partition of the key, as Kafka's Java client picks it."""

    topic: str
    idempotency_key: str
    key: bytes | str | None = None
    value: bytes | str | None = None
    headers: list = field(default_factory=list)
    partition: int | None = None


def send(records) -> None:
    """Queue ``records`` (:class:`OutputRecord`) for production when the
    range closes. Raises :class:`sluice_guest.Fatal` with the host's reason
    when it refuses (no ``--output-topic``, a topic the pipeline does not
    name, a partition the topic lacks, more than 64 MiB in one range): the
    range fails even if the error is caught."""
    from . import Fatal

    k = host().kafka()
    if k is None:
        raise Fatal("kafka: no kafka capability granted (outside a sink stage in the host)")
    from componentize_py_types import Err
    from wit_world.imports.types import Header

    wit = [
        k.OutputRecord(
            topic=r.topic,
            partition=r.partition,
            key=_as_bytes("key", r.key),
            value=_as_bytes("value", r.value),
            headers=[Header(key=name, value=_as_bytes("header", v)) for name, v in r.headers],
            idempotency_key=r.idempotency_key,
        )
        for r in records
    ]
    try:
        k.send(wit)
    except Err as e:
        raise Fatal(f"kafka: {e.value}") from None
