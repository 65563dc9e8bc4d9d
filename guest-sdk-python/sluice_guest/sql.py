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

from ._host import host
from ._sqlcore import SqlError, _from_wit, _raise, _sql, _to_wit, identifier


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


from .table import Table  # noqa: E402  (re-exported: plugins write sql.Table)
