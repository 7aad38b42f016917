"""Small specs, models and fast policy settings shared by the policy tests (no tests here)."""

from __future__ import annotations

import math
from typing import Any

import torch

from core.network import NetworkModel
from core.spec import ExperimentSpec, parse_spec

# Settings that keep one proposal in the tens of milliseconds (tests check behaviour, not
# optimizer quality).
FAST: dict[str, dict[str, Any]] = {
    "mcbo": {
        "restarts": 2,
        "raw_samples": 16,
        "maxiter": 15,
        "nn_restarts": 4,
        "steps": 3,
        "mc_samples": 4,
        "rescore_samples": 8,
        "candidate_steps": 3,
        "max_seconds": 5.0,
    },
    "eifn": {"restarts": 2, "raw_samples": 16, "maxiter": 15, "mc_samples": 8, "max_seconds": 5.0},
    "gpucb": {"restarts": 2, "raw_samples": 16, "maxiter": 15, "max_seconds": 5.0},
    "eicbo": {"restarts": 2, "raw_samples": 16, "maxiter": 15, "mc_samples": 8, "max_seconds": 5.0},
    "dgpucb": {"restarts": 2, "raw_samples": 16, "maxiter": 15, "max_seconds": 5.0},
    "random": {},
    # paper 002's composite policies (array specs) and the scalar-metric EI baseline
    "eimetric": {"restarts": 2, "raw_samples": 16, "maxiter": 15, "max_seconds": 5.0},
    "eicf": {"restarts": 2, "raw_samples": 16, "maxiter": 15, "mc_samples": 8, "fit_steps": 5},
    "ucbcf": {"restarts": 2, "raw_samples": 16, "maxiter": 15, "mc_samples": 8, "fit_steps": 5},
    # paper 001's multi-fidelity policies (fidelity specs only)
    "besd": {"grid_size": 40, "alternatives": 16, "restarts": 0},
    "ei": {"grid_size": 40, "restarts": 0},
    "lcb": {"grid_size": 40, "restarts": 0},
    "hyperband": {},
    "mfkg": {
        "grid_size": 40,
        "fantasies": 8,
        "acquisition_restarts": 2,
        "raw_samples": 16,
        "maxiter": 10,
    },
    # paper 000's policies (parameter-vector specs only)
    "hagpucb": {"candidates": 32, "sweeps": 1},
    "addgpucb": {"candidates": 32, "sweeps": 1},
    "cmaes": {},
}
POLICIES = ("mcbo", "eifn", "gpucb")  # the acquisition policies that take any reward


def chain_spec(
    *,
    intervention: str = "soft",
    noise: float = 0.0,
    actions: list[dict[str, Any]] | None = None,
    target_sets: list[list[str]] | None = None,
    constraints: dict[str, Any] | None = None,
    candidates: list[list[float]] | None = None,
    nodes: int = 3,
) -> ExperimentSpec:
    """A chain X0 -> X1 -> ... -> Y; soft actions a_i feed X_i by default."""
    names = [f"X{i}" for i in range(nodes - 1)] + ["Y"]
    node_specs = [
        {
            "name": name,
            "parents": [names[i - 1]] if i else [],
            "bounds": [-3.0, 3.0],
            "noise_std": noise,
        }
        for i, name in enumerate(names)
    ]
    if actions is None:
        targets = names if intervention == "soft" else names[:-1]
        actions = [
            {"name": f"a{i}", "targets": [target], "bounds": [0.0, 1.0]}
            for i, target in enumerate(targets)
        ]
    data: dict[str, Any] = {
        "name": "chain",
        "intervention": intervention,
        "nodes": node_specs,
        "actions": actions,
        "reward": {"node": "Y"},
        "constraints": constraints or {},
    }
    if intervention == "hard":
        data["target_sets"] = target_sets or [[], *[[a["name"]] for a in actions]]
    if candidates is not None:
        data["candidates"] = candidates
    return parse_spec(data)


def truth(spec: ExperimentSpec, intervention: dict[str, float]) -> dict[str, float]:
    """A smooth noiseless structural model for any chain spec: X_i = sin(2·parent) + Σ inputs."""
    values: dict[str, float] = {}
    hard = spec.intervention == "hard"
    for node in spec.nodes:
        setters = [a.name for a in spec.actions if hard and a.targets == [node.name]]
        if setters and setters[0] in intervention:
            values[node.name] = intervention[setters[0]]
            continue
        total = sum(math.sin(2.0 * values[p]) for p in node.parents)
        if not hard:
            total += sum(
                (1.5 - i * 0.5) * intervention.get(a.name, 0.0)
                for i, a in enumerate(spec.actions)
                if node.name in a.targets
            )
        values[node.name] = total
    return values


def random_intervention(spec: ExperimentSpec, generator: torch.Generator) -> dict[str, float]:
    if spec.intervention == "hard":
        sets = spec.allowed_target_sets()
        chosen = sets[int(torch.randint(len(sets), (1,), generator=generator))]
    else:
        chosen = tuple(spec.action_names)
    out = {}
    for name in chosen:
        low, high = spec.action(name).bounds
        out[name] = low + (high - low) * float(torch.rand(1, generator=generator))
    return out


def trained_model(spec: ExperimentSpec, rounds: int, seed: int = 0) -> NetworkModel:
    model = NetworkModel(spec)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(rounds):
        intervention = random_intervention(spec, generator)
        model.learn(intervention, truth(spec, intervention))
    return model
