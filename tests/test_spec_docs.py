"""docs/spec.md and docs/spec.schema.json are what the models generate: they cannot drift."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from agent.cli import main
from agent.spec_docs import SCHEMA, json_schema, reference, stale
from core.spec import ExperimentSpec

DOCS = Path(__file__).resolve().parent.parent / "docs"
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_the_committed_reference_and_schema_are_up_to_date():
    assert stale(DOCS) == [], "run `cbo-agent spec-docs` and commit docs/spec.md, spec.schema.json"


def test_every_field_is_in_the_reference():
    text = reference()
    for section in ("nodes[]", "actions[]", "reward", "constraints", "model", "policy",
                    "initial_design", "schedule", "policy.settings"):  # fmt: skip
        assert f"## `{section}`" in text, section
    for model in [ExperimentSpec, *(f.annotation for f in ExperimentSpec.model_fields.values())]:
        for name, field in getattr(model, "model_fields", {}).items():
            assert f"| `{field.alias or name}` |" in text, name
    assert "| `rounds` | integer ≥ 0 or null | null | How many rounds" in text
    assert "| `max_rounds` | integer ≥ 1 or null | null | Stop proposing" in text


def test_check_fails_on_a_stale_file_and_writing_fixes_it(tmp_path, capsys):
    assert main(["spec-docs", "--check", "--out", str(tmp_path)]) == 1  # nothing there yet
    assert "spec.md is out of date" in capsys.readouterr().err
    assert main(["spec-docs", "--out", str(tmp_path)]) == 0
    assert main(["spec-docs", "--check", "--out", str(tmp_path)]) == 0
    (tmp_path / SCHEMA).write_text("{}\n")
    assert main(["spec-docs", "--check", "--out", str(tmp_path)]) == 1


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_example_satisfies_the_schema(path):
    """The schema an editor checks against accepts what the agent accepts."""
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(yaml.safe_load(path.read_text()), json_schema())


def test_the_schema_refuses_a_misspelled_key():
    jsonschema = pytest.importorskip("jsonschema")
    data = yaml.safe_load((EXAMPLES / "dropwave.yaml").read_text())
    data["schedule"] = {"max_round": 3}
    with pytest.raises(jsonschema.ValidationError, match="max_round"):
        jsonschema.validate(data, json.loads((DOCS / SCHEMA).read_text()))
