"""``Table``: a table kept current by upserts and deletes, through the
host's bulk path (``sluice:plugin/sql.apply``, contract 0.2.2, and
``sql.apply-versioned``, 0.2.3) — the Rust
SDK's ``sql::Table`` in Python, making the same host call.

The host folds the changes to each key's last one and sends them as
multi-row statements of up to 512 rows (the portable ``INSERT … ON CONFLICT
(key) DO UPDATE SET c = excluded.c`` and ``DELETE … WHERE key IN (…)``), or
on PostgreSQL, from 256 rows on, by ``COPY`` and a merge.
"""

from __future__ import annotations

from ._sqlcore import SqlError, _raise, _sql, _to_wit, identifier


class Table:
    """A table that a sink keeps current from upserts and deletes (a row
    per primary key).

    ``Table(name, columns, key)``: ``key`` is the primary key (or a unique
    constraint), a non-empty subset of ``columns``; the table must exist
    when :meth:`apply` runs (create it in ``Sink.init``). Raises
    :class:`sluice_guest.Fatal` for a name that is not a plain SQL
    identifier, no columns, a repeated name or a key column that is not a
    column.
    """

    def __init__(self, name: str, columns, key):
        name = identifier("table", name)
        columns, key = list(columns), list(key)
        for c in columns + key:
            identifier("column", c)
        from . import Fatal

        if not columns or not key or len(set(columns)) != len(columns) or len(set(key)) != len(key):
            raise Fatal(f"table {name}: needs at least one column and one key column, each named once")
        missing = [k for k in key if k not in columns]
        if missing:
            raise Fatal(f"table {name}: key column {missing[0]} is not a column")
        self.name, self.columns, self.key = name, columns, key

    def apply(self, changes) -> int:
        """Apply ``changes`` — ``("upsert", [values of every column])`` or
        ``("delete", [values of the key columns])`` — so each row ends as
        if they had been applied one by one, in one host call. The host
        keeps each key's last change (a delete before it too, so unlisted
        columns return to their defaults) and sends the deletes, then the
        upserts, as multi-row statements; a key with a ``None`` is never
        folded. Returns the rows changed, a folded change counted once.

        Raises :class:`sluice_guest.sql.SqlError` whose ``row`` is the
        index in ``changes`` of the change the failing statement carried
        (its first, for a multi-row one); a change that is not
        ``("upsert" | "delete", values)`` is refused before anything is
        sent."""
        return self._send(changes, None)

    def apply_versioned(self, version_column: str, low, changes) -> int:
        """:meth:`apply` with a version guard (``sql.apply-versioned``,
        contract 0.2.3): last writer wins by version, as a change-data-capture
        sink needs. Each row keeps in ``version_column`` (one of the
        columns, not a key column) the version of its last applied change;
        a change applies only where the stored version is ``None`` or lies
        in [``low``, the change's version] as the database compares them
        (``low`` ``None``: no lower bound). An upsert's version is its value
        for ``version_column``; a delete is ``("delete", [key values...,
        version])``. Held-back changes change nothing and are not counted
        in the result; give a key's changes in version order (each key
        folds to its last change given, as in :meth:`apply`). Raises as
        :meth:`apply`, also for a version column that is not a column or is
        a key column."""
        return self._send(changes, (version_column, low))

    def _send(self, changes, guard) -> int:
        changes = list(changes)
        if not changes:
            return 0
        s = _sql()
        wit = []
        for i, change in enumerate(changes):
            kind, values = change if isinstance(change, (tuple, list)) and len(change) == 2 else (change, None)
            if not isinstance(values, (list, tuple)):
                raise SqlError(f"a change is ('upsert', values) or ('delete', key values), not {change!r}", row=i)
            if kind == "upsert":
                wit.append(s.Change_Upsert([_to_wit(s, v) for v in values]))
            elif kind == "delete":
                wit.append(s.Change_Delete([_to_wit(s, v) for v in values]))
            else:
                raise SqlError(f"a change is ('upsert', values) or ('delete', key values), not {kind!r}", row=i)
        from componentize_py_types import Err

        target = s.Target(self.name, self.columns, self.key)
        try:
            if guard is None:
                return s.apply(target, wit)
            column, low = guard
            return s.apply_versioned(target, s.VersionGuard(column, _to_wit(s, low)), wit)
        except Err as e:
            _raise(e)
