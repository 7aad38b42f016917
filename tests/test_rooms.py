"""The benchmarks are a room of their own (DESIGN.md): bench/ may import any room, no room imports
bench/, and the command line reaches it only through the `cbo_agent.commands` entry point."""

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
