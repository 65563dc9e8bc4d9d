"""Write Sluice map and sink stages in Python.

A plugin is a module (``app.py``) with a map stage, a sink stage or both,
built into a WebAssembly component with componentize-py against the
contract ``sluice:plugin@0.2.4`` (``wit/plugin.wit``)::

    import sluice_guest as sluice

    class Upper(sluice.Mapper):
        def __init__(self, config):          # once per instance
            self.suffix = config.get("suffix", "")

        def map(self, record, emit):
            if record.value is None:
                raise sluice.BadRecord("tombstone")
            emit(record.key, record.value.upper() + self.suffix.encode())

    Mapper = sluice.export_map(Upper)        # the names componentize-py looks for

Build it with ``python -m sluice_guest.build app.py -o upper.wasm`` and run
it with ``host test --plugin upper.wasm --input FILE`` or ``host run``.

Errors, as in the Rust SDK: raise :class:`BadRecord` to reject one record
(it goes to the pipeline's ``--on-error``), :class:`Retryable` to have the
host retry the call, :class:`Fatal` to stop the batch uncommitted. Any
other exception is a trap, like a Rust panic: the host discards the
instance and retries on a fresh one, and under ``--on-error dlq`` narrows
it down to the records that raise it; componentize-py prints the
traceback into the host's log, and the host's message names the
exception and the innermost place (``ValueError: … (at app.py:22, in
map)``). An :class:`sluice_guest.sql.SqlError` left
uncaught in a sink stage fails the part, as a fatal error.
"""

from __future__ import annotations

from . import kafka, log, sql  # noqa: F401 (public submodules)
from . import _host
from ._host import host
from .wire import Outputs, Record, WireError, read_records, read_sink_records

__all__ = [
    "BadRecord",
    "Config",
    "Emit",
    "Fatal",
    "Mapper",
    "Part",
    "Record",
    "Retryable",
    "Sink",
    "SinkRecord",
    "export_map",
    "export_sink",
    "kafka",
    "log",
    "sql",
]

#: The contract this SDK is built for (``wit/plugin.wit``).
CONTRACT = "sluice:plugin@0.2.4"


class StageError(Exception):
    """Base of the errors a stage raises on purpose."""


class BadRecord(StageError):
    """This record cannot be processed: the host applies ``--on-error``
    to it (``fail`` stops the batch, ``dlq`` dead-letters it with its
    bytes, ``skip`` counts it); the rest of the call goes on. ``index``:
    from :meth:`Sink.write_chunk`, the position of the record in the
    chunk (not needed elsewhere: the SDK knows the record)."""

    def __init__(self, message: str, index: int | None = None):
        super().__init__(message)
        self.index = index


class Retryable(StageError):
    """The call may succeed if tried again (``--attempts``)."""


class Fatal(StageError):
    """Stop the batch before it commits (it is re-run on the next start)."""


class Config:
    """The pipeline's ``--config KEY=VALUE`` pairs (every plugin of a
    pipeline sees them all, so keys a stage does not know are another's).
    """

    def get(self, key: str, default: str | None = None) -> str | None:
        """The value of ``key``, else ``default``."""
        v = host().config_get(key)
        return default if v is None else v

    def int(self, key: str, default: int | None = None) -> int | None:
        """``key`` as an integer; :class:`Fatal` naming it when it is not."""
        v = host().config_get(key)
        if v is None:
            return default
        try:
            return int(v)
        except ValueError:
            raise Fatal(f"config `{key}` = `{v}` is not an integer") from None

    def bool(self, key: str, default: bool | None = None) -> bool | None:
        """``key`` as ``true``/``false`` (also 1/0, yes/no, on/off)."""
        v = host().config_get(key)
        if v is None:
            return default
        t = v.strip().lower()
        if t in ("true", "1", "yes", "on"):
            return True
        if t in ("false", "0", "no", "off"):
            return False
        raise Fatal(f"config `{key}` = `{v}` is not true or false")

    def require(self, key: str) -> str:
        """The value of ``key``; :class:`Fatal` naming it when missing."""
        v = host().config_get(key)
        if v is None:
            raise Fatal(f"config `{key}` is required (--config {key}=…)")
        return v

    def all(self) -> dict[str, str]:
        """Every pair."""
        return dict(host().config_all())


class Emit:
    """Passed to :meth:`Mapper.map`: call it once per output record, with
    ``key`` and ``value`` as bytes, str (UTF-8) or ``None`` (a ``None``
    value is a tombstone), and optional ``headers`` as ``(name, value)``
    pairs. Outputs of one record keep their order; the n-th (n ≥ 1) gets
    idempotency key ``topic/partition/offset#n``."""

    def __init__(self, outputs: Outputs):
        self._outputs = outputs
        self._index = 0

    def __call__(self, key, value, headers=()) -> None:
        self._outputs.push(self._index, key, value, headers)


class Mapper:
    """A map stage: subclass it, take the :class:`Config` in ``__init__``
    and implement :meth:`map`."""

    def __init__(self, config: Config):
        pass

    def map(self, record: Record, emit: Emit) -> None:
        """Turn ``record`` into zero or more outputs (``emit``); none is
        counted as filtered."""
        raise NotImplementedError


class Part:
    """One partition's range of a batch, or a consecutive part of it, as a
    sink's ``open`` sees it: ``topic``, ``partition``, ``start_offset``,
    ``end_offset`` (half-open), ``batch_id``, ``epoch``, ``query_id``."""

    def __init__(self, ctx):
        self.topic = ctx.topic
        self.partition = ctx.partition
        self.start_offset = ctx.start_offset
        self.end_offset = ctx.end_offset
        self.batch_id = ctx.batch.batch_id
        self.epoch = ctx.batch.epoch
        self.query_id = ctx.batch.query_id


class SinkRecord:
    """A record handed to a sink: ``record`` (the mapped key, value and
    headers, with the source's topic, partition and offset) and its
    ``idempotency_key`` (``topic/partition/offset``, ``…#n`` for a
    record's n-th further output), the same across re-runs."""

    __slots__ = ("idempotency_key", "record")

    def __init__(self, idempotency_key: str, record: Record):
        self.idempotency_key = idempotency_key
        self.record = record


class Sink:
    """A sink stage: subclass it and implement :meth:`write` (or
    :meth:`write_chunk`); :meth:`init`, :meth:`open` and :meth:`close` have
    defaults."""

    #: Return it from :meth:`open` when the whole part is applied already
    #: (a sink that tracks its own progress); ``None`` means proceed.
    ALREADY_APPLIED = "already-applied"

    def __init__(self, config: Config):
        pass

    def init(self) -> None:
        """Once per instance, before its first ``open`` and inside that
        part's transaction: create tables here (``CREATE TABLE IF NOT
        EXISTS``). Runs again on the fresh instance after a failed part."""

    def open(self, part: Part):
        """Begin a part."""
        return None

    def write(self, record: SinkRecord) -> None:
        """Write one record."""
        raise NotImplementedError

    def write_chunk(self, records: list[SinkRecord]) -> None:
        """Write what one host call carries; the default calls
        :meth:`write` per record. To reject one record of the chunk,
        raise ``BadRecord("…", index=i)`` with its position."""
        for i, r in enumerate(records):
            try:
                _sync(self.write(r), "write")
            except BadRecord as e:
                if e.index is None:
                    e.index = i
                raise
            except UnicodeDecodeError as e:
                raise BadRecord(f"not UTF-8: {e}", index=i) from None

    def close(self) -> None:
        """End the part (with the SQL capability, the host commits)."""


def _stage_error(types, e: Exception):
    """``e`` as the WIT ``stage-error`` (an ``Err`` to raise)."""
    from componentize_py_types import Err

    if isinstance(e, Retryable):
        return Err(types.StageError_Retryable(str(e)))
    if isinstance(e, sql.SqlError):
        return Err(types.StageError_Fatal(f"sql: {e}"))
    return Err(types.StageError_Fatal(str(e)))


def export_map(stage: type[Mapper]):
    """The class componentize-py exports as the plugin's map stage (assign
    it to a module-level ``Mapper``). One ``stage`` object is made per
    component instance, on the first call, with the pipeline's config."""
    _host.preload()
    state = {}

    class _Export:
        def map(self, ctx, records: bytes):
            from wit_world.exports import mapper
            from wit_world.imports import types

            try:
                if "stage" not in state:
                    state["stage"] = _make(stage, "map stage")
                try:
                    outputs, rejected = map_call(state["stage"], records)
                except WireError as e:
                    raise Fatal(f"malformed packed batch from the host: {e}") from None
                return mapper.MapResult(
                    outputs=outputs,
                    rejected=[types.BadRecord(index=i, message=m) for i, m in rejected],
                )
            except (Retryable, Fatal, sql.SqlError) as e:
                raise _stage_error(types, e) from None

    _Export.__name__ = "Mapper"
    _Export._sluice_stage = "map"
    return _Export


def map_call(stage: Mapper, records: bytes) -> tuple[bytes, list[tuple[int, str]]]:
    """One map call: ``packed-records`` in, ``packed-outputs`` and the
    rejected records ``(index, message)`` out (shared by the component
    export and :mod:`sluice_guest.testing`)."""
    outputs = Outputs()
    emit = Emit(outputs)
    rejected = []
    for i, record in enumerate(read_records(records)):
        emit._index = i
        mark = outputs.mark()
        try:
            _sync(stage.map(record, emit), "map")
        except BadRecord as e:
            outputs.rewind(mark)  # a rejected record has no outputs
            rejected.append((i, str(e)))
        except UnicodeDecodeError as e:
            outputs.rewind(mark)
            rejected.append((i, f"not UTF-8: {e}"))
    return outputs.finish(), rejected


def _sync(result, what: str):
    """``result`` of stage method ``what``, refused when it is a coroutine:
    the host's calls are synchronous, so an ``async def`` method's work
    (and its errors) would be lost."""
    import inspect

    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()
        raise TypeError(f"{what} returned an awaitable: stage methods must be plain functions (not async def)")
    return result


def _make(stage, what: str):
    """The stage object, made with the pipeline's config. A ``Fatal`` or
    ``Retryable`` from its constructor (or ``init``) is that stage error,
    a ``BadRecord`` a fatal one naming the stage (as ``new`` returning an
    error in the Rust SDK); any other exception is a trap (as a panic in
    ``new``)."""
    try:
        return stage(Config())
    except (Retryable, Fatal, sql.SqlError):
        raise
    except BadRecord as e:
        raise Fatal(f"{what} init: {e}") from None


def export_sink(stage: type[Sink]):
    """The class componentize-py exports as the plugin's sink stage
    (assign it to a module-level ``Sink``). One ``stage`` object is made
    per component instance, on its first ``open``; its :meth:`Sink.init`
    runs then, inside that part's transaction."""
    _host.preload()
    state = {}

    class _Export:
        def open(self, ctx):
            from wit_world.exports import sink
            from wit_world.imports import types

            try:
                if "stage" not in state:
                    s = _make(stage, "sink stage")
                    try:
                        _sync(s.init(), "init")
                    except BadRecord as e:
                        raise Fatal(f"sink stage init: {e}") from None
                    state["stage"] = s
                answer = _sync(state["stage"].open(Part(ctx)), "open")
            except BadRecord as e:
                raise _stage_error(types, Fatal(f"bad record from open: {e}")) from None
            except (Retryable, Fatal, sql.SqlError) as e:
                raise _stage_error(types, e) from None
            if answer == Sink.ALREADY_APPLIED:
                return sink.OpenAnswer.ALREADY_APPLIED
            return sink.OpenAnswer.PROCEED

        def write(self, records: bytes) -> None:
            from componentize_py_types import Err
            from wit_world.imports import types

            try:
                chunk = [SinkRecord(k, r) for k, r in read_sink_records(records)]
            except WireError as e:
                raise _stage_error(types, Fatal(f"malformed packed batch from the host: {e}")) from None
            try:
                _sync(state["stage"].write_chunk(chunk), "write_chunk")
            except BadRecord as e:
                index = e.index if e.index is not None else (0 if len(chunk) == 1 else None)
                if index is None or not 0 <= index < len(chunk):
                    # Rejecting the wrong record would dead-letter a good one.
                    raise _stage_error(
                        types,
                        Fatal(f"a bad record from write_chunk without a valid index (BadRecord(..., index=i)): {e}"),
                    ) from None
                raise Err(types.StageError_BadRecord(types.BadRecord(index=index, message=str(e)))) from None
            except (Retryable, Fatal, sql.SqlError) as e:
                raise _stage_error(types, e) from None

        def close(self) -> None:
            from wit_world.imports import types

            try:
                _sync(state["stage"].close(), "close")
            except BadRecord as e:
                raise _stage_error(types, Fatal(f"bad record from close: {e}")) from None
            except (Retryable, Fatal, sql.SqlError) as e:
                raise _stage_error(types, e) from None

    _Export.__name__ = "Sink"
    _Export._sluice_stage = "sink"
    return _Export
