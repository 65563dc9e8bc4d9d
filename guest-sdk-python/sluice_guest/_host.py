"""What a stage can ask of the host (``log``, ``config``, ``sql``,
``kafka``), behind
one object: inside a component the generated ``wit_world`` bindings
answer; natively (unit tests) a stand-in with a given config logs to
stderr and has no SQL connection.
"""

from __future__ import annotations

import importlib
import sys


class NativeHost:
    """The host of native runs: ``config`` pairs given by the test."""

    def __init__(self, config: dict[str, str] | None = None):
        self.config = dict(config or {})

    def log(self, level: str, message: str) -> None:
        print(f"[{level}] {message}", file=sys.stderr)

    def config_get(self, key: str) -> str | None:
        return self.config.get(key)

    def config_all(self) -> list[tuple[str, str]]:
        return sorted(self.config.items())

    def sql(self):
        return None

    def kafka(self):
        return None


class ComponentHost:
    """The host of a component: the generated imports."""

    def __init__(self):
        from wit_world.imports import config, log  # noqa: F401 (only inside a component)

        self._log = log
        self._config = config

    def log(self, level: str, message: str) -> None:
        self._log.log(getattr(self._log.Level, level.upper()), message)

    def config_get(self, key: str) -> str | None:
        return self._config.get(key)

    def config_all(self) -> list[tuple[str, str]]:
        return list(self._config.get_all())

    def sql(self):
        """The generated ``sql`` import, or ``None`` in a world without it
        (a map-only plugin)."""
        try:
            from wit_world.imports import sql
        except ImportError:
            return None
        return sql

    def kafka(self):
        """The generated ``kafka`` import, or ``None`` in a world without
        it (a map-only plugin)."""
        try:
            from wit_world.imports import kafka
        except ImportError:
            return None
        return kafka


_HOST = None


def preload() -> None:
    """Import the generated bindings now, while componentize-py imports
    the app at build time: it keeps only what was imported then (a
    binding first imported inside a call is not found at run time).
    Natively there are none, and nothing happens."""
    for name in ("config", "kafka", "log", "sql", "types"):
        try:
            importlib.import_module(f"wit_world.imports.{name}")
        except ImportError:
            pass
    for name in ("mapper", "sink"):
        try:
            importlib.import_module(f"wit_world.exports.{name}")
        except ImportError:
            pass
    try:
        importlib.import_module("componentize_py_types")
    except ImportError:
        pass


def host():
    """The current host: set by ``install``, else the component's when the
    bindings exist, else a native one with no config."""
    global _HOST
    if _HOST is None:
        try:
            _HOST = ComponentHost()
        except ImportError:
            _HOST = NativeHost()
    return _HOST


def install(h) -> None:
    """Use ``h`` from now on (the testing helpers install a NativeHost)."""
    global _HOST
    _HOST = h
