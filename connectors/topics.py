"""The MQTT topic layout of cbo-agent, in one place.

Per device of an experiment (``{prefix}/{experiment}/{device}/{kind}``): the device id is a
level of the topic, so a broker ACL can let each login publish only under its own id
(Mosquitto: ``pattern write cbo/+/%u/reading``, `deploy/mosquitto/acl`):

- ``action``      agent → the experiment's actuator: the intervention of a round
- ``ack``         actuator → agent: what the device applied
- ``reading``     sensors → agent: one node value or reward component per message
- ``oracle``      simulators → agent: E[y | action] and the optimum, for true regret
- ``deadletter``  device → operators: an action the device could not decode

Per experiment: ``{prefix}/{experiment}/deadletter`` (agent → operators: input the agent
rejected, with the reason) and ``{prefix}/{experiment}/recommendation`` (agent → operators,
retained: the setting the policy would run if the experiment stopped now). Per agent:
``{prefix}/agents/{agent_id}/status`` (retained; the last will says "offline").

The fleet's control plane: ``{prefix}/control/request`` (operators → replicas) and
``{prefix}/control/reply/{request_id}`` (replicas → operators).

Experiment ids, device ids, agent ids and every level of the prefix are identifiers: 1 to 64
characters from ``[A-Za-z0-9_.-]``, so they can never contain a topic separator or an MQTT
wildcard.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Final, Literal, NamedTuple, get_args

DEFAULT_PREFIX: Final = "cbo"
MAX_IDENTIFIER_LENGTH: Final = 64
# "agents" is the level under which per-agent topics live; an experiment of that name would make
# `{prefix}/agents/...` ambiguous to operators reading the broker's topic tree.
RESERVED_EXPERIMENT_IDS: Final = frozenset({"agents", "control"})

TopicKind = Literal["action", "ack", "reading", "oracle", "deadletter"]
DEVICE_TOPIC_KINDS: Final[tuple[TopicKind, ...]] = get_args(TopicKind)
ExperimentTopicKind = Literal["deadletter", "recommendation"]
EXPERIMENT_TOPIC_KINDS: Final[tuple[ExperimentTopicKind, ...]] = get_args(ExperimentTopicKind)

_IDENTIFIER = re.compile(rf"[A-Za-z0-9_.\-]{{1,{MAX_IDENTIFIER_LENGTH}}}")
_AGENTS_LEVEL: Final = "agents"
_CONTROL_LEVEL: Final = "control"
_STATUS_LEVEL: Final = "status"


class TopicError(ValueError):
    """A topic or an identifier that cannot be part of the cbo-agent topic layout."""


class InvalidIdentifierError(TopicError):
    """An experiment id, agent id or prefix level breaks the identifier rules."""


class ForeignTopicError(TopicError):
    """A topic that is not part of this layout (other prefix, shape or kind)."""


PARSED_TOPICS: Final = 4096  # topics `Topics.parse` remembers


class ParsedTopic(NamedTuple):
    """An experiment or device topic taken apart; `device` is None for experiment topics."""

    experiment: str
    kind: TopicKind | ExperimentTopicKind
    device: str | None = None


def validate_identifier(value: str, what: str = "identifier") -> str:
    """Return `value` if it is a valid identifier, else raise InvalidIdentifierError.

    `what` names the value in the error message ("experiment id", "agent id", ...).
    """
    if not isinstance(value, str) or not _IDENTIFIER.fullmatch(value):
        raise InvalidIdentifierError(
            f"invalid {what} {value!r}: need 1 to {MAX_IDENTIFIER_LENGTH} characters "
            "from [A-Za-z0-9_.-]"
        )
    return value


def validate_experiment_id(experiment: str) -> str:
    """Return `experiment` if it may name an experiment, else raise InvalidIdentifierError."""
    validate_identifier(experiment, "experiment id")
    if experiment in RESERVED_EXPERIMENT_IDS:
        raise InvalidIdentifierError(f"experiment id {experiment!r} is reserved")
    return experiment


def validate_device_id(device: str) -> str:
    """Return `device` if it may name a device, else raise InvalidIdentifierError."""
    return validate_identifier(device, "device id")


def validate_agent_id(agent_id: str) -> str:
    """Return `agent_id` if it may name an agent, else raise InvalidIdentifierError."""
    return validate_identifier(agent_id, "agent id")


def _validate_prefix(prefix: str) -> str:
    if not isinstance(prefix, str) or not prefix:
        raise InvalidIdentifierError(f"invalid topic prefix {prefix!r}: must be non-empty")
    for level in prefix.split("/"):
        validate_identifier(level, f"topic prefix level (in {prefix!r})")
    return prefix


@dataclass(frozen=True)
class Topics:
    """Builds and parses the topics under one prefix (default "cbo"; may hold several levels)."""

    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        _validate_prefix(self.prefix)

    def experiment_topic(self, experiment: str, kind: ExperimentTopicKind) -> str:
        """`{prefix}/{experiment}/{kind}`: the agent's dead letters and its recommendation."""
        validate_experiment_id(experiment)
        if kind not in EXPERIMENT_TOPIC_KINDS:
            raise TopicError(
                f"{kind!r} is not an experiment topic kind ({EXPERIMENT_TOPIC_KINDS}); "
                "the others name a device"
            )
        return f"{self.prefix}/{experiment}/{kind}"

    def device_topic(self, experiment: str, device: str, kind: TopicKind) -> str:
        """`{prefix}/{experiment}/{device}/{kind}` after validating every part."""
        validate_experiment_id(experiment)
        validate_device_id(device)
        _validate_kind(kind)
        return f"{self.prefix}/{experiment}/{device}/{kind}"

    def action(self, experiment: str, device: str) -> str:
        """Topic the agent publishes a round's intervention to, for the actuator `device`."""
        return self.device_topic(experiment, device, "action")

    def ack(self, experiment: str, device: str) -> str:
        """Topic the actuator `device` acknowledges applied (or rejected) actions on."""
        return self.device_topic(experiment, device, "ack")

    def reading(self, experiment: str, device: str) -> str:
        """Topic the sensor `device` publishes node values and reward components on."""
        return self.device_topic(experiment, device, "reading")

    def oracle(self, experiment: str, device: str) -> str:
        """Topic the simulator `device` publishes E[y | action] and the optimum on."""
        return self.device_topic(experiment, device, "oracle")

    def device_deadletter(self, experiment: str, device: str) -> str:
        """Topic a device republishes an action it could not decode on."""
        return self.device_topic(experiment, device, "deadletter")

    def deadletter(self, experiment: str) -> str:
        """Topic the agent republishes rejected input on, with the reason."""
        return self.experiment_topic(experiment, "deadletter")

    def recommendation(self, experiment: str) -> str:
        """Retained topic of the experiment's current (at the end: final) recommendation."""
        return self.experiment_topic(experiment, "recommendation")

    def status(self, agent_id: str) -> str:
        """Retained status topic of one agent (its last will lands here too)."""
        validate_agent_id(agent_id)
        return f"{self.prefix}/{_AGENTS_LEVEL}/{agent_id}/{_STATUS_LEVEL}"

    def device_filter(
        self, kind: TopicKind, experiment: str | None = None, device: str | None = None
    ) -> str:
        """Subscription filter for one kind of device topic; None matches every experiment
        (or every device)."""
        _validate_kind(kind)
        level = "+" if experiment is None else validate_experiment_id(experiment)
        who = "+" if device is None else validate_device_id(device)
        return f"{self.prefix}/{level}/{who}/{kind}"

    def control_request(self) -> str:
        """Topic operators publish control-plane requests on; every fleet replica reads it."""
        return f"{self.prefix}/{_CONTROL_LEVEL}/request"

    def control_reply(self, request_id: str) -> str:
        """Topic a replica answers one control request on."""
        validate_identifier(request_id, "request id")
        return f"{self.prefix}/{_CONTROL_LEVEL}/reply/{request_id}"

    def status_filter(self) -> str:
        """Subscription filter matching every agent's status topic."""
        return f"{self.prefix}/{_AGENTS_LEVEL}/+/{_STATUS_LEVEL}"

    def parse(self, topic: str) -> ParsedTopic:
        """Take an experiment or device topic apart; ForeignTopicError if it is not ours.

        A topic parsed once is remembered (`PARSED_TOPICS` of them, the least recently seen
        forgotten first): the agent parses every incoming message's topic, and a deployment has
        a few per device (a tenth of the router's time per message when parsed each time).
        """
        if not isinstance(topic, str):
            raise ForeignTopicError(f"topic {topic!r} is outside prefix {self.prefix!r}")
        return self._parse_remembered(topic)

    @functools.lru_cache(maxsize=PARSED_TOPICS)  # noqa: B019 (Topics is frozen and long-lived)
    def _parse_remembered(self, topic: str) -> ParsedTopic:
        levels = self._levels_below_prefix(topic)
        if len(levels) == 2 and levels[1] in EXPERIMENT_TOPIC_KINDS:
            experiment, kind = levels
            device = None
        elif len(levels) == 3 and levels[2] in DEVICE_TOPIC_KINDS:
            experiment, device, kind = levels
        else:
            raise ForeignTopicError(
                f"topic {topic!r} is not {self.prefix}/<experiment>/<device>/<kind> "
                f"(kind one of {DEVICE_TOPIC_KINDS}) nor {self.prefix}/<experiment>/deadletter"
            )
        try:
            validate_experiment_id(experiment)
            if device is not None:
                validate_device_id(device)
        except InvalidIdentifierError as error:
            raise ForeignTopicError(f"topic {topic!r}: {error}") from None
        return ParsedTopic(experiment, kind, device)  # type: ignore[arg-type]

    def parse_status(self, topic: str) -> str:
        """Return the agent id of a status topic; raise ForeignTopicError otherwise."""
        levels = self._levels_below_prefix(topic)
        if len(levels) != 3 or levels[0] != _AGENTS_LEVEL or levels[2] != _STATUS_LEVEL:
            raise ForeignTopicError(
                f"topic {topic!r} is not {self.prefix}/{_AGENTS_LEVEL}/<agent_id>/{_STATUS_LEVEL}"
            )
        try:
            return validate_agent_id(levels[1])
        except InvalidIdentifierError as error:
            raise ForeignTopicError(f"topic {topic!r}: {error}") from None

    def _levels_below_prefix(self, topic: str) -> list[str]:
        head = self.prefix + "/"
        if not isinstance(topic, str) or not topic.startswith(head):
            raise ForeignTopicError(f"topic {topic!r} is outside prefix {self.prefix!r}")
        return topic[len(head) :].split("/")


def _validate_kind(kind: str) -> None:
    if kind not in DEVICE_TOPIC_KINDS:
        raise TopicError(f"unknown topic kind {kind!r}; expected one of {DEVICE_TOPIC_KINDS}")
