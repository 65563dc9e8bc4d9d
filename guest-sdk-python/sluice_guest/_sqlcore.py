"""What the SQL capability's calls share (``sluice:plugin/sql``): the
error type, identifier checks, and the conversions to and from the
bindings' values. :mod:`sluice_guest.sql` and :mod:`sluice_guest.table`
both build on it; plugins import from :mod:`sluice_guest.sql`."""

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
