"""The rooms and their arrows (docs/design.md). The benchmarks are a room of their own: bench/
may import any room, no room imports bench/, and the command line reaches it only through the
`cbo_agent.commands` entry point. Among the other rooms every import, lazy ones inside functions
included, follows an arrow of ARROWS."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import subprocess
import sys
import tomllib
from pathlib import Path

from agent.cli import COMMANDS_GROUP, build_parser

ROOT = Path(__file__).resolve().parents[1]
ROOMS = ("agent", "core", "policies", "connectors", "sim")
# Who may import whom (besides itself), as docs/design.md draws it. agent wires every other
# room (its `sim` and `demo` commands run the simulators); sim's environments score a field with
# core's field metrics, so that an oracle and the spec's reward agree by construction.
ARROWS = {
    "agent": {"policies", "connectors", "core", "sim"},
    "policies": {"core"},
    "core": set(),
    "connectors": set(),
    "sim": {"connectors", "core"},
}
# Every module of the rooms, found by walking their folders (a new module is covered unasked).
PROBE = """
import importlib, json, pkgutil, sys
rooms = {rooms!r}
for room in rooms:
    package = importlib.import_module(room)
    for module in pkgutil.walk_packages(package.__path__, room + "."):
        importlib.import_module(module.name)
imported = sorted(name for name in sys.modules if name.split(".")[0] in rooms)
bench = sorted(name for name in sys.modules if name.split(".")[0] == "bench")
print(json.dumps({{"imported": imported, "bench": bench}}))
"""


def test_importing_every_module_of_the_other_rooms_loads_no_bench_module() -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE.format(rooms=ROOMS)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    loaded = json.loads(result.stdout.splitlines()[-1])
    # the walk reached the modules, the command line's included
    assert {"agent.cli", "agent.runtime", "core.spec", "policies.mcbo", "sim.device"} <= set(
        loaded["imported"]
    )
    assert loaded["bench"] == []


def _imports_of(path: Path) -> set[str]:
    """Top-level names of the modules `path` imports, statically or through importlib."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None))
            in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            names.add(str(node.args[0].value))
    return {name.split(".")[0] for name in names}


def test_no_module_outside_bench_imports_it() -> None:
    """tests/ drive the public harness (bench.harness); the rooms and deploy/ never name bench."""
    sources = [
        path
        for folder in (*ROOMS, "deploy")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if "__pycache__" not in path.parts
    ]
    assert ROOT / "agent" / "cli.py" in sources
    importers = [str(path.relative_to(ROOT)) for path in sources if "bench" in _imports_of(path)]
    assert importers == []


def test_every_import_between_rooms_follows_an_arrow() -> None:
    """policies/ once reached into sim/ for the devices' controllers through lazy imports inside
    functions; the scan reads whole modules, so such an import is caught too."""
    assert set(ARROWS) == set(ROOMS)
    wrong = []
    for room in ROOMS:
        for path in sorted((ROOT / room).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            reached = (_imports_of(path) & set(ROOMS)) - ARROWS[room] - {room}
            wrong += [f"{path.relative_to(ROOT)} imports {other}" for other in sorted(reached)]
    assert wrong == []


def test_the_controllers_come_from_the_entry_point_of_the_installed_package() -> None:
    from policies._controllers import CONTROLLERS_GROUP, controller

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    declared = project["project"]["entry-points"][CONTROLLERS_GROUP]
    assert declared == {"sim": "sim.controllers:controllers"}
    installed = {e.name: e.value for e in importlib.metadata.entry_points(group=CONTROLLERS_GROUP)}
    assert installed == declared, "stale install: reinstall cbo-agent (make .venv/.installed)"
    assert controller("mamujoco-swimmer").dim > 0


def test_the_scan_finds_each_way_of_importing(tmp_path: Path) -> None:
    """Keeps the scan above honest: each form it looks for is found."""
    for line in (
        "import bench.cli",
        "from bench.harness import procs",
        "from bench import regret",
        "importlib.import_module('bench.cli')",
        "__import__('bench')",
    ):
        source = tmp_path / "probe.py"
        source.write_text(line + "\n")
        assert "bench" in _imports_of(source), line


def test_the_bench_command_comes_from_the_entry_point_of_the_installed_package() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    declared = project["project"]["entry-points"][COMMANDS_GROUP]
    assert declared == {"bench": "bench.cli:register"}
    assert "bench*" in project["tool"]["setuptools"]["packages"]["find"]["include"]
    installed = {e.name: e.value for e in importlib.metadata.entry_points(group=COMMANDS_GROUP)}
    assert installed == declared, "stale install: reinstall cbo-agent (make .venv/.installed)"
    assert "bench" in build_parser().format_help()
