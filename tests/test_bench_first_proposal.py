"""`python -m bench.first_proposal`: one JSON line timing a policy's constructor and first
proposal."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from bench import first_proposal

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_one_line_with_the_constructor_and_the_first_proposal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = EXAMPLES / "mamujoco-swimmer.yaml"
    monkeypatch.setattr(sys, "argv", ["first_proposal", str(spec), "--setting", "t0=2"])
    threads = torch.get_num_threads()
    try:
        first_proposal.main()
    finally:  # main() sets one torch thread for its process: not for the rest of the session
        torch.set_num_threads(threads)
    (line,) = capsys.readouterr().out.splitlines()
    row = json.loads(line)
    assert row["spec"] == "mamujoco-swimmer" and row["policy"] == "hagpucb"
    assert row["construct_s"] >= 0 and row["propose_s"] >= 0 and row["phase"] == 1
    assert row["phase_one_rounds"] == 2 * (1 + 14 + 14 * 13 // 2)  # T0 stencils at D = 14
    assert len(row["load"]) == 2
