"""Who answers a question a task asks: the client that called, the operators, or nobody.

The tool says who may answer (``audience``: ``client``, ``operator`` or ``any``). Whether
the calling client can is what its call declared, recorded with the task at acceptance
(``Task.client_answers``): the elicitation modes it handles (its 2026 request's
``clientCapabilities``, or its 2025 session's ``initialize``), and on the 2026-07-28 wire
whether it declared the tasks extension, without which it has no ``tasks/update`` to answer
with.

A question the client cannot answer is never left waiting for it:

- when operators may answer it (audience ``any``, form mode: the inbox answers no URL-mode
  question), it is asked of the operators alone and waits in the inbox;
- otherwise it cannot be asked: ``MissingClientCapability`` (-32021, naming what is missing)
  reaches the tool at its ``ctx.ask``, and ends the task ``failed`` unless the tool catches it.

A task whose client's declarations were not recorded (``NULL``) is routed as the tool asks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from elicitations.models import Audience, Mode
from tasks_app.models import NO_TASKS, TASKS_EXTENSION
from tasks_app.tools import MissingClientCapability

# The error's data.reason, for clients and tests that tell this failure from others.
CLIENT_CANNOT_ANSWER = "client_cannot_answer"


@dataclass(frozen=True)
class Route:
    """How a question is opened: for AUDIENCE, and why the client was passed over (WHY is ""
    when it was not)."""

    audience: str
    why: str = ""


def _missing(mode: str, client_answers: str) -> tuple[list[str], dict[str, Any]]:
    """What the client lacks to answer a MODE question: the reasons, in words, and the
    capabilities that would have let it (both empty when it lacks nothing)."""
    declared = set(client_answers.split())
    reasons: list[str] = []
    required: dict[str, Any] = {}
    if mode not in declared:
        if declared & set(Mode.values):
            reasons.append(f"the client declared elicitation without {mode} mode")
        else:
            reasons.append(f"the client declared no elicitation capability ({mode} mode)")
        required["elicitation"] = {mode: {}}
    if NO_TASKS in declared:
        reasons.append(
            f"its call did not declare the {TASKS_EXTENSION} extension, through which a "
            "task's questions are answered (tasks/update)"
        )
        required["extensions"] = {TASKS_EXTENSION: {}}
    return reasons, required


def route(*, ask_key: str, mode: str, audience: str, client_answers: str | None) -> Route:
    """Where question ASK_KEY (MODE, for AUDIENCE) goes, for a client that declared
    CLIENT_ANSWERS (``Task.client_answers``). Raise MissingClientCapability when the client
    cannot answer it and no operator may."""
    if audience == Audience.OPERATOR or client_answers is None:
        return Route(audience)
    reasons, required = _missing(Mode(mode).value, client_answers)
    if not reasons:
        return Route(audience)
    why = "; ".join(reasons)
    if audience == Audience.ANY and mode == Mode.FORM:
        return Route(Audience.OPERATOR, why)
    only = "this question can only be answered by the client"
    if audience == Audience.ANY:
        only += " (operators do not answer URL-mode questions)"
    raise MissingClientCapability(
        f"Question {ask_key!r} cannot be asked: {why}; {only}",
        required=required,
        reason=CLIENT_CANNOT_ANSWER,
        question=ask_key,
    )
