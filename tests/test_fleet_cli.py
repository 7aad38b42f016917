"""`cbo-agent serve`'s mistakes: one line naming it, exit code 2, before anything starts."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from agent.cli import main
from agent.fleet import FleetSettings, default_replica_id


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--heartbeat", "20", "--lease-ttl", "15"], "heartbeat (20.0 s) must be positive and"),
        (["--store", "mysql://root@db/x"], "unknown store scheme 'mysql'"),
        (["--capacity", "0"], "argument --capacity: must be at least 1, got 0"),
        (["--lease-ttl", "-1"], "argument --lease-ttl: must be a positive number"),
        (["--store", "postgresql://cbo:pw@127.0.0.1:9/x"], "cannot open store"),
    ],
)
def test_serve_mistakes_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    argv = ["--store", str(tmp_path / "s.sqlite"), *argv] if "--store" not in argv else argv
    with (
        pytest.raises(SystemExit)
        if message.startswith("argument")
        else contextlib.nullcontext() as raised
    ):
        code = main(["serve", "--metrics-port", "0", *argv])
    if raised is not None:
        code = raised.value.code
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    (line,) = err.strip().splitlines()
    assert message in line and line.startswith("cbo-agent serve")


def test_settings_and_the_default_replica_id() -> None:
    assert FleetSettings(capacity=3, lease_ttl_s=9.0).period_s == 3.0
    with pytest.raises(ValueError, match="capacity"):
        FleetSettings(capacity=0)
    replica = default_replica_id()
    assert 1 <= len(replica) <= 64 and "/" not in replica and " " not in replica
