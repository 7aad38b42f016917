"""Who may say what: a message is taken only from a device the spec lets say it.

The device id is a level of every device topic (`connectors.topics`), and the broker's ACL lets
a login publish only under its own id (`deploy/mosquitto/acl`, ``pattern write cbo/+/%u/...``):
so the topic says who sent a message, and the payload's `device_id` must agree with it. Then the
spec's `devices` decide (`core.spec.DeviceSpec`):

- an ack counts only from the experiment's actuator, the device its actions go to;
- a reading only from a device bound to the reading's node;
- an oracle message only from a device the spec names as an oracle (a simulator).

Everything else is refused with a reason from `connectors.metrics.UNTRUSTED_REASONS`. This module
decides only; the runtime counts, logs and dead-letters what it refuses.
"""

from __future__ import annotations

from connectors.metrics import UntrustedReason
from connectors.schemas import Ack, Oracle, Reading
from core.spec import ExperimentSpec

__all__ = ["refusal"]


def refusal(
    spec: ExperimentSpec, sender: str, message: Ack | Reading | Oracle
) -> tuple[UntrustedReason, str] | None:
    """Why `sender` (the device level of the topic) may not say `message`, or None if it may.

    Returns (reason, detail): a reason code of `UNTRUSTED_REASONS` and a sentence for people.
    """
    if message.device_id != sender:
        return (
            "device_mismatch",
            f"payload names device {message.device_id!r} on {sender!r}'s topic",
        )
    device = spec.device(sender)
    if device is None:
        return "unknown_device", f"device {sender!r} does not serve experiment {spec.name!r}"
    if isinstance(message, Ack) and not device.actuator:
        return (
            "not_actuator",
            f"ack from {sender!r}; the actions of {spec.name!r} go to {spec.actuator_id!r}",
        )
    known_node = isinstance(message, Reading) and message.node in spec.node_names
    if known_node and message.node not in device.nodes:  # an unknown node: `unknown_node` later
        return "node_not_bound", f"device {sender!r} is not bound to node {message.node!r}"
    if isinstance(message, Oracle) and not device.oracle:
        return "not_oracle", f"device {sender!r} is not an oracle of {spec.name!r}"
    return None
