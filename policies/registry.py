"""Policy names -> classes, discovered from the modules of this package.

A new policy is one new file in policies/ defining a `Policy` subclass with a `name`; nothing
else changes.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from functools import cache
from typing import Any

import policies
from core.plain_errors import unknown_name
from core.spec import ExperimentSpec
from policies.base import Policy


@cache
def policy_classes() -> dict[str, type[Policy]]:
    """Every concrete policy in the package, by command-line name."""
    found: dict[str, type[Policy]] = {}
    for module in pkgutil.iter_modules(policies.__path__):
        if module.name.startswith("_") or module.name in {"base", "registry"}:
            continue
        loaded = importlib.import_module(f"policies.{module.name}")
        for value in vars(loaded).values():
            if (
                isinstance(value, type)
                and issubclass(value, Policy)
                and value is not Policy
                and getattr(value, "name", None)
                and value.__module__ == loaded.__name__
            ):
                if value.name in found:
                    raise RuntimeError(f"two policies are named {value.name!r}")
                found[value.name] = value
    return dict(sorted(found.items()))


def policy_names() -> list[str]:
    return list(policy_classes())


def make_policy(
    name: str, spec: ExperimentSpec, settings: Mapping[str, Any] | None = None
) -> Policy:
    """Instantiate the policy called `name` with validated settings."""
    classes = policy_classes()
    if name not in classes:
        raise KeyError(unknown_name("policy", name, list(classes)))
    return classes[name](spec, settings)
