"""`cbo-agent validate SPEC...`: check experiment specs, report every problem with its field."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TextIO

from core.spec import ExperimentSpec, SpecError, load_spec
from policies.registry import make_policy


def check_policy(spec: ExperimentSpec) -> list[str]:
    """Problems with the spec's policy name or settings (each names its field)."""
    try:
        make_policy(spec.policy.name, spec, spec.policy.settings)
    except KeyError as error:
        return [f"policy.name: {error.args[0]}"]
    except ValueError as error:
        return [str(error)]
    return []


def validate_files(paths: Sequence[str], out: TextIO | None = None) -> int:
    """Print one line per good spec and one per problem; return 0 if all are good, else 1."""
    out = out or sys.stdout  # resolved per call: stdout may be replaced after import
    failed = False
    for path in paths:
        try:
            spec = load_spec(path)
        except SpecError as error:
            failed = True
            for problem in error.problems:
                print(f"{path}: {problem}", file=out)
            continue
        problems = check_policy(spec)
        if problems:
            failed = True
            for problem in problems:
                print(f"{path}: {problem}", file=out)
            continue
        vector = spec.parameters
        actions = f"{len(spec.actions)} actions"
        if vector is not None:
            blocks = f" in {len(vector.blocks)} blocks" if vector.blocks else ""
            actions += f" ({vector.name}: a vector of {vector.dimension}{blocks})"
        print(
            f"{path}: ok ({spec.name}: {len(spec.nodes)} nodes, {actions}, "
            f"{spec.intervention} interventions, policy {spec.policy.name})",
            file=out,
        )
    return 1 if failed else 0
