"""The control plane's operations: submit, list, pause, resume, stop and status of experiments
in a fleet's store.

One set of functions, used by the command line (`agent.control_cli`: ``cbo-agent submit``,
``list``, ``pause``, ``resume``, ``stop``, ``status``) and by replicas answering requests on the
broker's control topic (`agent.control_topic`). Each returns a JSON-serializable dict; a user's
mistake (unknown experiment, a stopped one resumed, a spec clashing with a stored one) is a
`ControlError` with one line. The store does the work and keeps it safe under concurrency: the
replicas running an experiment hear of a pause or stop with their next lease renewal.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, Literal

from connectors.store import ExperimentRow, Store, StoreError
from core.errors import SpecError
from core.spec import ExperimentSpec, parse_spec

__all__ = ["VERBS", "ControlError", "Verb", "list_experiments", "set_state", "status", "submit"]

Verb = Literal["pause", "resume", "stop"]
VERBS: Final[tuple[str, ...]] = ("submit", "list", "pause", "resume", "stop", "status")


class ControlError(Exception):
    """A control request that cannot be done, in one line (the caller's mistake)."""


def spec_document(spec: ExperimentSpec) -> dict[str, Any]:
    """The spec as the store keeps it (the same JSON `Experiment` writes)."""
    return spec.model_dump(mode="json", by_alias=True)


def submit(store: Store, specs: Sequence[ExperimentSpec]) -> list[dict[str, Any]]:
    """Add each experiment for the fleet to run; submitting the same spec again changes nothing.

    Raises:
        ControlError: a name that exists with another spec (nothing after it is submitted).
    """
    done = []
    for spec in specs:
        try:
            added = store.submit(spec.name, spec_document(spec))
        except StoreError as error:
            raise ControlError(str(error)) from None
        done.append({"experiment": spec.name, "submitted": added})
    return done


def submit_document(store: Store, document: Any) -> list[dict[str, Any]]:
    """Validate a spec sent as a JSON object (the control topic's submit) and submit it.

    Raises:
        ControlError: the spec is invalid (every problem, joined) or clashes with a stored one.
    """
    try:
        spec = parse_spec(document, "<control request>")
    except SpecError as error:
        raise ControlError("; ".join(error.problems)) from None
    return submit(store, [spec])


def set_state(store: Store, verb: Verb, name: str) -> dict[str, Any]:
    """Pause, resume or stop the experiment; `changed` is False if it was so already.

    Raises:
        ControlError: unknown experiment, or one that is stopped (final).
    """
    operations = {"pause": store.pause, "resume": store.resume, "stop": store.stop}
    _require(store, name)
    try:
        changed = operations[verb](name)
    except StoreError as error:
        raise ControlError(str(error)) from None
    return {"experiment": name, "verb": verb, "changed": changed, **_row(_find(store, name))}


def list_experiments(store: Store) -> list[dict[str, Any]]:
    """Every experiment's desired state and lease, by name."""
    return [_row(row) for row in store.experiments()]


def status(store: Store, name: str) -> dict[str, Any]:
    """The experiment's desired state and lease with its rounds, readings and budget spent.

    Raises:
        ControlError: unknown experiment.
    """
    _require(store, name)
    found = store.experiment_status(name)
    spec = store.experiment_spec(name) or {}
    budget = (spec.get("constraints") or {}).get("budget_total")
    return {
        **_row(found.experiment),
        "rounds": found.rounds,
        "open_rounds": found.open_rounds,
        "readings": found.readings,
        "spent": found.spent,
        "budget_total": budget,
    }


def _row(row: ExperimentRow) -> dict[str, Any]:
    return {
        "experiment": row.name,
        "state": row.state,
        "owner": row.owner if row.leased else None,
        "epoch": row.epoch,
        "lease_expires_at": row.lease_expires_at if row.leased else None,
    }


def _find(store: Store, name: str) -> ExperimentRow:
    for row in store.experiments():
        if row.name == name:
            return row
    raise ControlError(f"no experiment {name!r} in {store.path}")


def _require(store: Store, name: str) -> None:
    names = store.experiment_names()
    if name not in names:
        known = ", ".join(names[:20]) + (", ..." if len(names) > 20 else "") or "none"
        raise ControlError(f"no experiment {name!r} in {store.path} (known: {known})")
