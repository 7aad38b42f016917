"""Additive GP-UCB with a given decomposition (paper 000's ablation: known structure).

The groups come from the settings (`groups`, coordinate indices in the spec's action order, or
action names), else from the spec's parameter blocks (each block a group, every coordinate
outside a block a group of its own), else every coordinate alone. The model and the
acquisition are `policies._additive_ucb`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from pydantic import Field

from core.network import NetworkModel
from core.spec import ExperimentSpec
from policies._additive_ucb import AdditiveUCB, AdditiveUCBSettings, check_parameter_experiment
from policies.base import Constraints, Policy, Proposal


class AddGPUCBSettings(AdditiveUCBSettings):
    """Additive GP-UCB settings, and the decomposition."""

    groups: list[list[int | str]] | None = Field(
        default=None,
        description="The coordinate groups (overlaps allowed), each a list of action indices "
        "(the spec's order) or names. null: the spec's parameter blocks, else one coordinate "
        "per group.",
    )


def given_groups(spec: ExperimentSpec, groups: list[list[int | str]] | None) -> list[list[int]]:
    """The decomposition of `AddGPUCBSettings.groups` (see the module docstring).

    Raises:
        ValueError: an unknown action name or an index out of range, naming it.
    """
    names = spec.action_names
    if groups is not None:
        out = []
        for g, group in enumerate(groups):
            indices = []
            for item in group:
                if isinstance(item, str):
                    if item not in names:
                        raise ValueError(f"groups[{g}]: unknown action {item!r}")
                    indices.append(names.index(item))
                elif 0 <= item < len(names):
                    indices.append(item)
                else:
                    raise ValueError(f"groups[{g}]: index {item} is not in [0, {len(names)})")
            out.append(indices)
        covered = {i for g in out for i in g}
        out += [[i] for i in range(len(names)) if i not in covered]
        return out
    blocks = spec.parameters.blocks if spec.parameters is not None else {}
    if blocks:
        offset = names.index(spec.parameter_vector[0])
        out = [list(range(offset + a, offset + b)) for a, b in blocks.values()]
        covered = {i for g in out for i in g}
        return out + [[i] for i in range(len(names)) if i not in covered]
    return [[i] for i in range(len(names))]


class AddGPUCBPolicy(Policy):
    """GP-UCB with an additive kernel over a decomposition known in advance."""

    name = "addgpucb"
    Settings = AddGPUCBSettings
    handles_block_limits = True  # policies._additive_ucb keeps it

    def __init__(self, spec: ExperimentSpec, settings: Mapping[str, Any] | None = None) -> None:
        super().__init__(spec, settings)
        check_parameter_experiment(spec, self.name)
        try:
            groups = given_groups(spec, self.settings.groups)
        except ValueError as error:
            raise ValueError(f"{self.name}: policy.settings.{error}") from None
        self._ucb = AdditiveUCB(spec, groups, self.settings)

    def propose(
        self, model: NetworkModel, constraints: Constraints, rng: torch.Generator
    ) -> Proposal:
        return self._ucb.propose(model, constraints, rng)
