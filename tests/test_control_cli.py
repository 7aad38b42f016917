"""The control plane on the command line: submit, list, pause, resume, stop and status against
a real store, on SQLite and PostgreSQL; each mistake one line and exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.cli import main
from connectors.store import Store

ROOT = Path(__file__).resolve().parent.parent
TOY = str(ROOT / "examples" / "toygraph.yaml")
DROPWAVE = str(ROOT / "examples" / "dropwave.yaml")


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, captured.out, captured.err


def test_control_plane_round_trip(store_target: str, capsys: pytest.CaptureFixture[str]) -> None:
    s = ("--store", store_target)
    assert _run(capsys, "submit", TOY, DROPWAVE, *s)[:2] == (
        0,
        "toygraph: submitted\ndropwave: submitted\n",
    )
    assert _run(capsys, "submit", TOY, *s)[:2] == (0, "toygraph: already there\n")
    code, out, _ = _run(capsys, "list", *s, "--json")
    assert code == 0
    assert [(r["experiment"], r["state"], r["owner"]) for r in json.loads(out)] == [
        ("dropwave", "running", None),
        ("toygraph", "running", None),
    ]
    assert _run(capsys, "pause", "toygraph", *s)[:2] == (
        0,
        "toygraph paused owner=- epoch=0\n",
    )
    assert _run(capsys, "pause", "toygraph", *s)[1].endswith("(unchanged)\n")
    assert _run(capsys, "resume", "toygraph", *s)[1].startswith("toygraph running")
    assert _run(capsys, "stop", "toygraph", *s)[1].startswith("toygraph stopped")
    code, out, _ = _run(capsys, "status", "dropwave", *s, "--json")
    row = json.loads(out)
    assert (code, row["state"], row["rounds"], row["spent"]) == (0, "running", 0, 0.0)
    with Store(store_target) as store:
        assert {r.name: r.state for r in store.experiments()} == {
            "dropwave": "running",
            "toygraph": "stopped",
        }


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["resume", "toygraph"], "cbo-agent resume: experiment 'toygraph' is stopped"),
        (["pause", "nope"], "cbo-agent pause: no experiment 'nope' in "),
        (["status", "nope"], "cbo-agent status: no experiment 'nope' in "),
        (["submit", TOY, "--rounds", "3"], "cbo-agent submit: experiment 'toygraph' already"),
        (["submit", "nofile.yaml"], "cbo-agent submit: nofile.yaml: no such spec file"),
        (["submit", TOY, "--set", "schedule.max_round=3"], "schedule.max_round: unknown key"),
    ],
)
def test_mistakes_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    target = str(tmp_path / "s.sqlite")
    with Store(target) as store:
        assert _run(capsys, "submit", TOY, "--store", target)[0] == 0
        store.stop("toygraph")
    code, _, err = _run(capsys, *argv, "--store", target)
    assert code == 2
    (line,) = err.splitlines()
    assert line.startswith("cbo-agent ") and message in line


def test_no_store_is_not_created(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "absent.sqlite"
    code, _, err = _run(capsys, "list", "--store", str(target))
    assert code == 2 and err.startswith("cbo-agent list: no store at ")
    assert not target.exists()
