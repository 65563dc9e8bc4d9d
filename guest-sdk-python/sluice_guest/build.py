"""Build a Python plugin into a WebAssembly component.

    python -m sluice_guest.build app.py [-o app.wasm]

``app.py`` defines ``Mapper = sluice_guest.export_map(…)``, ``Sink =
sluice_guest.export_sink(…)`` or both; the world of the contract
(``map-plugin``, ``sink-plugin``, ``map-sink-plugin``) follows from which.
The module is imported natively first (a syntax error or a missing export
shows at once), then componentize-py builds the component against the
WIT shipped with this SDK. componentize-py is installed into this Python
environment with pip when it is missing (version pinned below).

Exit codes: 0 built, 1 the build failed, 2 bad usage or an app without
exports.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile

#: The componentize-py this SDK is tested with.
COMPONENTIZE_PY = "componentize-py==0.25.1"

SDK_DIR = os.path.dirname(os.path.abspath(__file__))


def _wit_dir() -> str:
    """The contract: shipped in the installed package, else (running from
    the repository) the repository's ``wit/``."""
    for d in (os.path.join(SDK_DIR, "wit"), os.path.join(SDK_DIR, "..", "..", "wit")):
        if os.path.isfile(os.path.join(d, "plugin.wit")):
            return os.path.abspath(d)
    print(f"the contract (wit/plugin.wit) is missing beside {SDK_DIR}: reinstall sluice-guest", file=sys.stderr)
    sys.exit(1)


_NAMES = {"map": "Mapper", "sink": "Sink"}
_MAKERS = {"map": "export_map", "sink": "export_sink"}


def export_problems(names: dict) -> list[str]:
    """What is wrong with a module's globals ``names``: a stage exported
    under a name componentize-py does not look for (``mapper`` is the
    JavaScript SDK's spelling), or a stage class defined with no stage
    made from it. Empty when they are right."""
    import sluice_guest

    problems, made = [], set()
    for name, value in names.items():
        kind = getattr(value, "_sluice_stage", None) if isinstance(value, type) else None
        if kind is None:
            continue
        made.add(kind)
        if name != _NAMES[kind]:
            problems.append(
                f"`{name}` is a {kind} stage, but componentize-py exports it only as `{_NAMES[kind]}`: "
                f"`{_NAMES[kind]} = sluice_guest.{_MAKERS[kind]}(…)`"
            )
    bases = {"map": sluice_guest.Mapper, "sink": sluice_guest.Sink}
    for name, value in names.items():
        for kind, base in bases.items():
            if isinstance(value, type) and issubclass(value, base) and value is not base and kind not in made:
                problems.append(
                    f"`{name}` is a {kind} stage class, but no {kind} stage is exported: "
                    f"`{_NAMES[kind]} = sluice_guest.{_MAKERS[kind]}({name})`"
                )
    return problems


def _world(app_path: str) -> str:
    directory, file = os.path.split(os.path.abspath(app_path))
    module = os.path.splitext(file)[0]
    # Loaded from its file, not by name: an app called like a module that
    # is already loaded (types.py, enum.py) must still be the app.
    spec = importlib.util.spec_from_file_location(f"_sluice_app_{module}", os.path.abspath(app_path))
    app = importlib.util.module_from_spec(spec)
    sys.path.insert(0, directory)
    try:
        spec.loader.exec_module(app)
    finally:
        sys.path.pop(0)
    problems = export_problems(vars(app))
    if problems:
        print(f"{app_path}:\n  " + "\n  ".join(problems), file=sys.stderr)
        sys.exit(2)
    has_map = getattr(getattr(app, "Mapper", None), "_sluice_stage", None) == "map"
    has_sink = getattr(getattr(app, "Sink", None), "_sluice_stage", None) == "sink"
    if has_map and has_sink:
        return "map-sink-plugin"
    if has_map:
        return "map-plugin"
    if has_sink:
        return "sink-plugin"
    print(
        f"{app_path} exports no stage: assign `Mapper = sluice_guest.export_map(YourStage)` "
        "and/or `Sink = sluice_guest.export_sink(YourSink)` at module level",
        file=sys.stderr,
    )
    sys.exit(2)


def _ensure_componentize_py() -> None:
    if importlib.util.find_spec("componentize_py") is not None:
        return
    print(f"installing {COMPONENTIZE_PY} (pip) …", file=sys.stderr)
    if subprocess.run([sys.executable, "-m", "pip", "install", "-q", COMPONENTIZE_PY]).returncode != 0:
        print(f"could not install {COMPONENTIZE_PY}: see pip's message above", file=sys.stderr)
        sys.exit(1)


def build(app_path: str, out: str) -> int:
    """Build ``app_path`` into ``out``; the componentize-py exit code."""
    world = _world(app_path)
    _ensure_componentize_py()
    directory, file = os.path.split(os.path.abspath(app_path))
    module = os.path.splitext(file)[0]
    with tempfile.TemporaryDirectory(prefix="sluice-build-") as tmp:
        # Only this SDK goes in beside the app, not the whole environment.
        shutil.copytree(SDK_DIR, os.path.join(tmp, "sluice_guest"), ignore=shutil.ignore_patterns("__pycache__", "wit"))
        cmd = [
            sys.executable,
            "-c",
            "import sys; from componentize_py import script; sys.argv[0] = 'componentize-py'; sys.exit(script())",
            "-d",
            _wit_dir(),
            "-w",
            world,
            "componentize",
            module,
            "-p",
            directory,
            "-p",
            tmp,
            "-o",
            os.path.abspath(out),
        ]
        print(f"building {app_path} ({world}) -> {out}", file=sys.stderr)
        return subprocess.run(cmd).returncode


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m sluice_guest.build", description=__doc__.split("\n\n")[0])
    p.add_argument("app", help="the plugin module, e.g. app.py")
    p.add_argument("-o", "--output", help="the component to write (default: APP.wasm beside it)")
    a = p.parse_args()
    if not os.path.isfile(a.app):
        p.error(f"{a.app}: no such file")
    out = a.output or os.path.splitext(a.app)[0] + ".wasm"
    sys.exit(1 if build(a.app, out) else 0)


if __name__ == "__main__":
    main()
