"""The control plane over MQTT: a fleet replica's answer to a request on
``{prefix}/control/request`` (docs/protocol.md, "Control plane").

The request (`cbo.control`) names a verb of `agent.control` and its argument; the answer
(`cbo.control_reply`) goes to ``{prefix}/control/reply/{request_id}``. Every replica answers
every request: the operations are idempotent, so a second replica's answer to the same pause
says ``changed: false``. A request older than `CONTROL_MAX_AGE_S` is dropped unanswered (one
queued by the broker for a replica that was down must not undo later changes), and so is one
that does not decode (logged; there is nobody to reply to).
"""

from __future__ import annotations

import time
from typing import Any

import structlog

from agent import control
from connectors.schemas import (
    CONTROL_MAX_AGE_S,
    ControlReply,
    ControlRequest,
    DecodeError,
    decode,
)
from connectors.store import Store, StoreError
from connectors.topics import Topics

log = structlog.get_logger(__name__)

__all__ = ["answer"]


def answer(
    store: Store, payload: bytes, replica: str, topics: Topics | None = None
) -> tuple[str, ControlReply] | None:
    """Do the request and return (reply topic, reply); None when there is nothing to answer.

    Runs store calls: call it in a worker thread.
    """
    try:
        request = decode(payload, ControlRequest)
    except DecodeError as error:
        log.warning("control.rejected", reason=error.reason, detail=error.detail)
        return None
    age = time.time() - request.at
    if age > CONTROL_MAX_AGE_S:
        log.warning("control.too_old", request_id=request.request_id, age_s=round(age, 1))
        return None
    try:
        result, error = _do(store, request), None
    except (control.ControlError, StoreError) as failure:
        result, error = None, str(failure)
    log.info("control.answered", request_id=request.request_id, verb=request.verb, ok=not error)
    reply = ControlReply(
        request_id=request.request_id,
        replica=replica,
        ok=error is None,
        error=error,
        result=result,
        at=time.time(),
    )
    return (topics or Topics()).control_reply(request.request_id), reply


def _do(store: Store, request: ControlRequest) -> Any:
    verb = request.verb
    if verb == "list":
        return control.list_experiments(store)
    if verb == "submit":
        if request.spec is None:
            raise control.ControlError("submit needs the spec (a JSON object) in 'spec'")
        return control.submit_document(store, request.spec)
    if request.experiment is None:
        raise control.ControlError(f"{verb} needs 'experiment'")
    if verb == "status":
        return control.status(store, request.experiment)
    return control.set_state(store, verb, request.experiment)  # type: ignore[arg-type]
