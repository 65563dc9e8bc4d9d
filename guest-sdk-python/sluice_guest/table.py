"""``Table``: a table kept current by upserts and deletes, written in
multi-row statements — the Rust SDK's ``sql::Table`` in Python, sending the
same statements.

PostgreSQL answers each statement of a batch on its own, so one statement
carrying 64 rows does the work of 64 one-row statements at about 6× their
rate (docs/benchmarks.md, session 15). The statements are the portable
``INSERT … ON CONFLICT (key) DO UPDATE SET c = excluded.c`` and ``DELETE …
WHERE key IN (…)`` (a row value ``(a, b) IN ((…), …)`` for a key of several
columns).
"""

from __future__ import annotations

from .sql import SqlError, execute_batch, identifier

#: Rows per multi-row statement, at most.
ROWS_PER_STATEMENT = 64

#: Parameters per statement, at most (SQLite's default limit).
MAX_PARAMS = 32_766


def _placeholders(first: int, n: int) -> str:
    return "(" + ", ".join(f"${i}" for i in range(first, first + n)) + ")"


def _groups(n: int, width: int) -> str:
    return ", ".join(_placeholders(1 + r * width, width) for r in range(n))


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
        self.columns = len(columns)
        self.key_at = [columns.index(k) for k in key]
        self.rows_per_statement = max(1, min(ROWS_PER_STATEMENT, MAX_PARAMS // len(columns)))
        listed = ", ".join(columns)
        keys = ", ".join(key)
        sets = [f"{c} = excluded.{c}" for c in columns if c not in key]
        conflict = (
            f"ON CONFLICT ({keys}) DO UPDATE SET {', '.join(sets)}" if sets else f"ON CONFLICT ({keys}) DO NOTHING"
        )

        def upsert(rows):
            return f"INSERT INTO {name} ({listed}) VALUES {_groups(rows, len(columns))} {conflict}"

        self.upsert_one = upsert(1)
        self.upsert_many = upsert(self.rows_per_statement)
        self.delete_one = f"DELETE FROM {name} WHERE " + " AND ".join(f"{k} = ${i + 1}" for i, k in enumerate(key))
        if len(key) == 1:
            self.delete_many = f"DELETE FROM {name} WHERE {key[0]} IN {_placeholders(1, self.rows_per_statement)}"
        else:
            self.delete_many = f"DELETE FROM {name} WHERE ({keys}) IN ({_groups(self.rows_per_statement, len(key))})"

    def apply(self, changes) -> int:
        """Apply ``changes`` — ``("upsert", [values of every column])`` or
        ``("delete", [values of the key columns])`` — in order, so each row
        ends as if they had been applied one by one: consecutive changes
        of one kind go together; within a run of upserts only each key's
        last one is sent (never folding a key with a ``None``); whole
        groups of 64 rows go in multi-row statements, the rest one row per
        statement. Returns the rows changed.

        Raises :class:`sluice_guest.sql.SqlError` whose ``row`` is the
        index in ``changes`` of the change the failing statement carried
        (its first, for a multi-row one)."""
        changed = 0
        for kind, multi, rows, origin in self._plan(list(changes)):
            one, many = (self.upsert_one, self.upsert_many) if kind == "upsert" else (self.delete_one, self.delete_many)
            try:
                changed += execute_batch(many if multi else one, rows)
            except SqlError as e:
                raise SqlError(e.message, e.code, row=origin[e.row or 0]) from None
        return changed

    def _plan(self, changes):
        steps, run, kind = [], [], None
        for i, (k, values) in enumerate(changes):
            if k not in ("upsert", "delete"):
                raise SqlError(f"a change is ('upsert', values) or ('delete', key values), not {k!r}", row=i)
            width = self.columns if k == "upsert" else len(self.key_at)
            if len(values) != width:
                raise SqlError(f"an {k} change carries {len(values)} values, the table takes {width}", row=i)
            if kind is not None and kind != k:
                self._flush(kind, run, steps)
                run = []
            kind = k
            run.append((i, list(values)))
        if kind is not None:
            self._flush(kind, run, steps)
        return steps

    def _flush(self, kind, run, steps):
        if kind == "upsert":
            last = {}
            for n, (_, row) in enumerate(run):
                key = tuple((type(row[k]), row[k]) for k in self.key_at)
                if all(row[k] is not None for k in self.key_at):
                    last[key] = n
            run = [
                (i, row)
                for n, (i, row) in enumerate(run)
                if any(row[k] is None for k in self.key_at)
                or last[tuple((type(row[k]), row[k]) for k in self.key_at)] == n
            ]
        whole = len(run) // self.rows_per_statement * self.rows_per_statement
        grouped, rest = run[:whole], run[whole:]
        if grouped:
            size = self.rows_per_statement
            chunks = [grouped[j : j + size] for j in range(0, whole, size)]
            steps.append((kind, True, [[v for _, row in c for v in row] for c in chunks], [c[0][0] for c in chunks]))
        if rest:
            steps.append((kind, False, [row for _, row in rest], [i for i, _ in rest]))
