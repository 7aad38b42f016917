"""`cbo-agent export`: Parquet that reads back as the CSV export, from either backend, and the
store `run` uses."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq  # the parquet extra, part of the test extra: Parquet is shipped
import pytest

from agent.cli import main
from agent.experiment import Experiment
from connectors.schemas import Oracle
from connectors.store import EXPORT_TABLES, Store
from tests.test_agent_join import ack, chain_spec, reading

EXPERIMENT = "join"


def filled_store(path: Path | str) -> Path | str:
    """A store with three rounds of one experiment: actions, acks, readings, oracle values."""
    with Store(path) as store:
        exp = Experiment(chain_spec(), store, seed=1)
        for number in range(3):
            live = exp.propose()
            exp.mark_published(live.number)
            exp.on_ack(ack(exp, number))
            exp.on_readings(
                [
                    reading(exp, number, node, 0.1 * i + number / 3, 10 * number + i)
                    for i, node in enumerate("ABC")
                ]
            )
            oracle = Oracle(
                experiment=exp.name,
                round=number,
                action_id=live.action.action_id,
                expected_reward=0.5 + number / 7,
                optimum=2.0,
                device_id="dev",
                at=123.25,
            )
            exp.on_oracle(oracle)
        # two devices' traces of visited states, float32 and float64 (protocol version 4)
        store.add_states(EXPERIMENT, 1, "dev", STATES.astype(np.float32), 124.5)
        store.add_states(EXPERIMENT, 2, "dev", STATES, 125.5)
    return path


STATES = np.linspace(-1.0, 1.0, 24).reshape(4, 2, 3)


def export(capsys, *args: str) -> list[Path]:
    capsys.readouterr()  # what came before (log lines) is not the export's output
    assert main(["export", EXPERIMENT, *args]) == 0, capsys.readouterr().err
    return [Path(line) for line in capsys.readouterr().out.split()]


def csv_rows(path: Path) -> tuple[list[str], list[list[str]]]:
    with open(path, newline="") as handle:
        header, *rows = list(csv.reader(handle))
    return header, rows


def as_csv_text(value: object) -> str:
    """How the CSV writer renders a value: None empty, floats by repr, a list as JSON."""
    if isinstance(value, list):
        return "[" + ",".join(repr(float(v)) for v in value) + "]"
    return "" if value is None else str(value)


def test_parquet_export_reads_back_equal_to_the_csv_export(store_target, tmp_path, capsys):
    store = filled_store(store_target)
    csv_paths = export(capsys, "--store", str(store), "--out", str(tmp_path / "csv"))
    parquet_paths = export(
        capsys, "--store", str(store), "--format", "parquet", "--out", str(tmp_path / "pq")
    )
    assert [p.suffix for p in parquet_paths] == [".parquet"] * len(EXPORT_TABLES)
    assert [p.stem for p in parquet_paths] == [p.stem for p in csv_paths]
    sizes = {}
    for csv_path, parquet_path in zip(csv_paths, parquet_paths, strict=True):
        header, rows = csv_rows(csv_path)
        table = pq.read_table(parquet_path)
        assert table.column_names == header, parquet_path.name
        columns = table.to_pydict()
        read_back = [[as_csv_text(columns[name][i]) for name in header] for i in range(len(table))]
        assert read_back == rows, parquet_path.name
        sizes[parquet_path.stem.removeprefix(f"{EXPERIMENT}_")] = len(rows)
    assert sizes["readings"] == 9 and sizes["rounds"] == 3 and sizes["oracle"] == 3
    assert sizes["visited_states"] == 2
    traces = pq.read_table(next(p for p in parquet_paths if p.stem.endswith("_visited_states")))
    assert str(traces.schema.field("states").type) == "list<element: double>"
    for row, dtype in zip(traces.to_pylist(), ("float32", "float64"), strict=True):
        assert row["dtype"] == dtype and json.loads(row["shape"]) == [4, 2, 3]
        expected = STATES.astype(dtype).astype(np.float64).ravel().tolist()
        assert row["states"] == expected  # the stored values, bit for bit
    # typed columns, not strings: a reading's value is a float64 equal to what was stored
    readings = pq.read_table(next(p for p in parquet_paths if p.stem.endswith("_readings")))
    assert str(readings.schema.field("value").type) == "double"
    with Store(store) as opened:
        assert readings.column("value").to_pylist() == [r.value for r in opened.readings("join")]
    assert not list((tmp_path / "pq").glob("*.tmp"))


def test_export_finds_the_store_like_run_does(tmp_path, capsys, monkeypatch):
    """--store > CBO_STORE_PATH > store.path of --config > cbo-agent.sqlite in the cwd."""
    from_env = filled_store(tmp_path / "env.sqlite")
    from_flag = filled_store(tmp_path / "flag.sqlite")
    from_file = filled_store(tmp_path / "file.sqlite")
    config = tmp_path / "agent.yaml"
    config.write_text(f"store: {{path: {from_file}}}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CBO_STORE_PATH", raising=False)

    def exported_from(*args: str) -> Path:
        out = tmp_path / f"out{len(list(tmp_path.glob('out*')))}"
        assert main(["export", EXPERIMENT, "--out", str(out), *args]) == 0
        capsys.readouterr()
        return out

    assert exported_from("--config", str(config)).exists()  # the config file's store
    monkeypatch.setenv("CBO_STORE_PATH", str(from_env))
    assert exported_from().exists()  # the environment's store
    assert exported_from("--config", str(config)).exists()  # the environment beats the file
    (tmp_path / "env.sqlite").rename(tmp_path / "gone.sqlite")
    assert main(["export", EXPERIMENT, "--config", str(config)]) == 2
    assert f"no store at {from_env}" in capsys.readouterr().err  # it was the one read
    assert exported_from("--store", str(from_flag)).exists()  # the flag beats both

    monkeypatch.delenv("CBO_STORE_PATH")
    assert main(["export", EXPERIMENT]) == 2  # the default, cbo-agent.sqlite here: none
    err = capsys.readouterr().err
    assert "no store at cbo-agent.sqlite" in err and "CBO_STORE_PATH" in err
    assert not (tmp_path / "cbo-agent.sqlite").exists()  # not created by looking


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("store: {path: 3}\n", "store.path"),
        ("stor: {}\n", "stor: unknown key (did you mean 'store'?)"),
        ("store: {path: 'mysql://u:pw@db/x'}\n", "store.path: unknown store scheme 'mysql'"),
    ],
)
def test_export_refuses_bad_configuration(tmp_path, capsys, monkeypatch, text, message):
    monkeypatch.delenv("CBO_STORE_PATH", raising=False)
    config = tmp_path / "agent.yaml"
    config.write_text(text)
    assert main(["export", EXPERIMENT, "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cbo-agent export: configuration:") and message in err
    assert "pw" not in err and err.count("\n") == 1


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_export_never_follows_a_planted_symlink(tmp_path, capsys, monkeypatch, fmt):
    """Symlinks planted at the old fixed temporary name, at the next names the temporary-file
    generator will draw, and at the final name: the export writes its own fresh files (O_EXCL
    skips a taken name) and the links' target is never touched."""
    import tempfile

    store = filled_store(tmp_path / "agent.sqlite")
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    names = ["planted", "planted2", "fresh"]
    monkeypatch.setattr(tempfile, "_get_candidate_names", lambda: iter(list(names)))
    for table in EXPORT_TABLES:
        final = f"{EXPERIMENT}_{table}.{fmt}"
        (out / f"{final}.tmp").symlink_to(victim)  # the name the export once used
        for name in names[:2]:
            (out / f".{final}.{name}.tmp").symlink_to(victim)
    (out / f"{EXPERIMENT}_readings.{fmt}").symlink_to(victim)
    paths = export(capsys, "--store", str(store), "--format", fmt, "--out", str(out))
    assert victim.read_text() == "precious\n"
    for path in paths:
        assert path.is_file() and not path.is_symlink(), path
        assert path.stat().st_size > 0
    # the planted links are left as they were; no temporary file of ours remains
    assert sorted(p.name for p in out.iterdir() if p.name.endswith(".tmp")) == sorted(
        name
        for table in EXPORT_TABLES
        for name in (
            f"{EXPERIMENT}_{table}.{fmt}.tmp",
            *(f".{EXPERIMENT}_{table}.{fmt}.{n}.tmp" for n in names[:2]),
        )
    )


def test_export_refuses_an_out_that_is_a_file(tmp_path, capsys):
    store = filled_store(tmp_path / "agent.sqlite")
    taken = tmp_path / "report.csv"
    taken.write_text("mine\n")
    capsys.readouterr()
    assert main(["export", EXPERIMENT, "--store", str(store), "--out", str(taken)]) == 2
    err = capsys.readouterr().err
    assert err == f"cbo-agent export: --out {taken}: exists and is not a directory\n"
    assert taken.read_text() == "mine\n"
    # below a file: one line, no traceback
    assert main(["export", EXPERIMENT, "--store", str(store), "--out", str(taken / "x")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cbo-agent export: ") and err.count("\n") == 1, err
    assert "Traceback" not in err


def test_the_store_refuses_a_directory_that_is_a_file(tmp_path):
    from connectors.store import StoreError

    with Store(filled_store(tmp_path / "agent.sqlite")) as store:
        taken = tmp_path / "taken"
        taken.write_text("")
        with pytest.raises(StoreError, match="exists and is not a directory"):
            store.export(EXPERIMENT, taken)


def test_export_has_the_devices_measurement_time(tmp_path, capsys):
    """`measured_at` is the reading's `at` (the device's clock), `received_at` the agent's."""
    path = tmp_path / "agent.sqlite"
    with Store(path) as store:
        exp = Experiment(chain_spec(), store, seed=1)
        live = exp.propose()
        exp.mark_published(live.number)
        exp.on_ack(ack(exp, 0))
        exp.on_readings(
            [
                reading(exp, 0, node, 0.5, i).model_copy(update={"at": 1_700_000_000.25 + i})
                for i, node in enumerate("ABC")
            ]
        )
    (readings,) = [
        p
        for p in export(capsys, "--store", str(path), "--out", str(tmp_path))
        if "readings" in p.name
    ]
    header, rows = csv_rows(readings)
    measured = [row[header.index("measured_at")] for row in rows]
    assert measured == [repr(1_700_000_000.25 + i) for i in range(3)]
    assert all(row[header.index("received_at")] for row in rows)
