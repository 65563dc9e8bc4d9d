"""The host's SQL capability, for sink stages (``sluice:plugin/sql``).

Every call runs inside the host's transaction for the partition range (or
part of one) being written; the host commits it together with its
progress row, so the effect happens exactly once even for SQL that is not
idempotent. Never begin, commit or roll back yourself. Placeholders are
``$1 … $n`` on SQLite and PostgreSQL.

Parameters and results are Python values: ``None`` (NULL), ``int`` (a
64-bit integer; ``bool`` is taken as 0/1), ``float``, ``str``, ``bytes``.
:class:`Table` keeps a table current from upserts and deletes in
multi-row statements. An error is raised as :class:`SqlError` (with the database's code:
SQLSTATE, or SQLite's extended code name); left uncaught in a sink
stage it fails the part (rolled back; the batch is not committed), as
``?`` on an ``SqlError`` does in the Rust SDK.
"""

from __future__ import annotations

import re

from ._host import host

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}\Z")


class SqlError(Exception):
    """A database error, or a refusal by the host (code ``sluice``)."""

    def __init__(self, message: str, code: str = "sluice", row: int | None = None):
        super().__init__(message)
        self.message = message
        self.code = code
        #: For :func:`execute_batch`: the index of the failing row.
        self.row = row

    def __str__(self) -> str:
        at = "" if self.row is None else f"row {self.row}: "
        return f"{at}{self.message} (code {self.code})"


def _not_granted() -> SqlError:
    return SqlError("no sql capability granted (configure the pipeline with --sink-db)")


def identifier(what: str, name: str) -> str:
    """Check that ``name``, the value of setting ``what``, is a plain SQL
    identifier (``[A-Za-z_][A-Za-z0-9_]*``, at most 63 bytes), so it can
    be put into a statement unquoted on both dialects. Returns it; raises
    :class:`sluice_guest.Fatal` otherwise (for a stage's constructor)."""
    from . import Fatal

    if not _IDENT.match(name):
        raise Fatal(
            f"{what} `{name}` is not a plain SQL identifier ([A-Za-z_][A-Za-z0-9_]*, at most 63 bytes)"
        )
    return name


def _sql():
    s = host().sql()
    if s is None:
        raise _not_granted()
    return s


def _to_wit(s, v):
    if v is None:
        return s.Value_Null()
    if isinstance(v, bool):
        return s.Value_Integer(int(v))
    if isinstance(v, int):
        return s.Value_Integer(v)
    if isinstance(v, float):
        return s.Value_Real(v)
    if isinstance(v, str):
        return s.Value_Text(v)
    if isinstance(v, (bytes, bytearray, memoryview)):
        return s.Value_Blob(bytes(v))
    raise TypeError(f"an SQL parameter must be None, int, float, str or bytes, not {type(v).__name__}")


def _from_wit(v):
    return getattr(v, "value", None)


def _raise(e) -> None:
    """Turn the bindings' ``Err`` into :class:`SqlError`."""
    err = e.value
    if hasattr(err, "row"):
        raise SqlError(err.error.message, err.error.code, row=err.row) from None
    raise SqlError(err.message, err.code) from None


def dialect() -> str | None:
    """``"sqlite"`` or ``"postgres"``; ``None`` without a connection."""
    s = host().sql()
    return None if s is None else s.dialect()


def execute(statement: str, params=()) -> int:
    """Run one statement; the number of rows changed."""
    s = _sql()
    from componentize_py_types import Err

    try:
        return s.execute(statement, [_to_wit(s, p) for p in params])
    except Err as e:
        _raise(e)


def execute_batch(statement: str, rows) -> int:
    """Run one statement once per parameter row, in order, in one host
    call; the total number of rows changed. The same effect as
    :func:`execute` per row at a fraction of the cost. On an error,
    :attr:`SqlError.row` is the failing row's index."""
    s = _sql()
    from componentize_py_types import Err

    try:
        return s.execute_batch(statement, [[_to_wit(s, p) for p in row] for row in rows])
    except Err as e:
        _raise(e)


class Rows:
    """The result of :func:`query`: ``columns`` (names) and ``rows`` (a
    list of lists of Python values)."""

    def __init__(self, columns: list[str], rows: list[list]):
        self.columns = columns
        self.rows = rows

    def __iter__(self):
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)


def query(statement: str, params=()) -> Rows:
    """Run one query. The host returns at most 100,000 rows or 64 MiB."""
    s = _sql()
    from componentize_py_types import Err

    try:
        r = s.query(statement, [_to_wit(s, p) for p in params])
    except Err as e:
        _raise(e)
    return Rows(list(r.columns), [[_from_wit(v) for v in row] for row in r.rows])


from .table import Table  # noqa: E402  (uses the calls above)
