"""The MQTT topic layout of cbo-agent, in one place.

Per experiment (``{prefix}/{experiment}/{kind}``):

- ``action``      agent → actuators: the intervention of a round
- ``ack``         actuators → agent: what a device applied
- ``reading``     sensors → agent: one node value or reward component per message
- ``oracle``      simulators → agent: E[y | action] and the optimum, for true regret
- ``deadletter``  agent → operators: input the agent rejected, with the reason

Per agent: ``{prefix}/agents/{agent_id}/status`` (retained; the last will says "offline").

The fleet's control plane: ``{prefix}/control/request`` (operators → replicas) and
``{prefix}/control/reply/{request_id}`` (replicas → operators).

Experiment ids, agent ids and every level of the prefix are identifiers: 1 to 64 characters
from ``[A-Za-z0-9_.-]``, so they can never contain a topic separator or an MQTT wildcard.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal, NamedTuple, get_args

DEFAULT_PREFIX: Final = "cbo"
MAX_IDENTIFIER_LENGTH: Final = 64
# "agents" is the level under which per-agent topics live; an experiment of that name would make
# `{prefix}/agents/...` ambiguous to operators reading the broker's topic tree.
RESERVED_EXPERIMENT_IDS: Final = frozenset({"agents", "control"})

TopicKind = Literal["action", "ack", "reading", "oracle", "deadletter"]
EXPERIMENT_TOPIC_KINDS: Final[tuple[TopicKind, ...]] = get_args(TopicKind)

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


class ParsedTopic(NamedTuple):
    """An experiment topic taken apart."""

    experiment: str
    kind: TopicKind


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

    def experiment_topic(self, experiment: str, kind: TopicKind) -> str:
        """`{prefix}/{experiment}/{kind}` after validating both parts."""
        validate_experiment_id(experiment)
        _validate_kind(kind)
        return f"{self.prefix}/{experiment}/{kind}"

    def action(self, experiment: str) -> str:
        """Topic the agent publishes a round's intervention to."""
        return self.experiment_topic(experiment, "action")

    def ack(self, experiment: str) -> str:
        """Topic actuators acknowledge applied (or rejected) actions on."""
        return self.experiment_topic(experiment, "ack")

    def reading(self, experiment: str) -> str:
        """Topic sensors publish node values and reward components on."""
        return self.experiment_topic(experiment, "reading")

    def oracle(self, experiment: str) -> str:
        """Topic simulators publish E[y | action] and the optimum on."""
        return self.experiment_topic(experiment, "oracle")

    def deadletter(self, experiment: str) -> str:
        """Topic the agent republishes rejected input on, with the reason."""
        return self.experiment_topic(experiment, "deadletter")

    def status(self, agent_id: str) -> str:
        """Retained status topic of one agent (its last will lands here too)."""
        validate_agent_id(agent_id)
        return f"{self.prefix}/{_AGENTS_LEVEL}/{agent_id}/{_STATUS_LEVEL}"

    def experiment_filter(self, kind: TopicKind, experiment: str | None = None) -> str:
        """Subscription filter for one kind, of one experiment or (None) of all experiments."""
        _validate_kind(kind)
        level = "+" if experiment is None else validate_experiment_id(experiment)
        return f"{self.prefix}/{level}/{kind}"

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
        """Take an experiment topic apart; raise ForeignTopicError if it is not one of ours."""
        levels = self._levels_below_prefix(topic)
        if len(levels) != 2:
            raise ForeignTopicError(f"topic {topic!r} is not {self.prefix}/<experiment>/<kind>")
        experiment, kind = levels
        try:
            validate_experiment_id(experiment)
        except InvalidIdentifierError as error:
            raise ForeignTopicError(f"topic {topic!r}: {error}") from None
        if kind not in EXPERIMENT_TOPIC_KINDS:
            raise ForeignTopicError(f"topic {topic!r}: unknown kind {kind!r}")
        return ParsedTopic(experiment, kind)

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
    if kind not in EXPERIMENT_TOPIC_KINDS:
        raise TopicError(f"unknown topic kind {kind!r}; expected one of {EXPERIMENT_TOPIC_KINDS}")
