"""Multi-round-trip requests (SEP-2322): ``InputRequiredResult`` and its ``requestState``.

A synchronous tool (or prompt) that needs answers before it can finish gets an
``InputRequiredResult`` back to the client; the client retries the same request with
``inputResponses`` and the ``requestState`` echoed byte for byte. The state carries the
answers of earlier rounds, so a multi-round call needs no server-side storage.

The spec treats ``requestState`` as attacker-controlled (basic/patterns/mrtr.mdx, "Security":
servers protect its integrity and bind it to the principal, a short expiry and the
originating request). It is signed with Django's signing module (HMAC-SHA256 over the
SECRET_KEY, salted, timestamped) and binds the client, the tool or prompt and a fingerprint
of the arguments; a tampered, expired or foreign state is refused with -32602.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import signing

from tasks_app import acceptance
from tasks_app.mcp.errors import InvalidParams
from tasks_app.models import Client

_SALT = "taskdesk.mcp.request-state"


def arguments_digest(arguments: dict[str, Any]) -> str:
    """The digest that binds a requestState to the call's arguments."""
    try:
        return acceptance.digest(arguments)
    except acceptance.InvalidToolArguments as exc:
        raise InvalidParams(str(exc)) from None


def seal(*, client: Client, subject: str, arguments_fp: str, answers: dict[str, Any]) -> str:
    """Sign the answers collected so far, bound to CLIENT, SUBJECT and the arguments."""
    payload = {"c": client.pk, "s": subject, "f": arguments_fp, "a": answers}
    return signing.dumps(payload, salt=_SALT, compress=True)


def unseal(state: str, *, client: Client, subject: str, arguments_fp: str) -> dict[str, Any]:
    """Return the answers inside STATE; raise InvalidParams unless it is intact, fresh and
    was issued for this client, tool (or prompt) and arguments."""
    max_age = settings.TASKDESK_MRTR_STATE_SECONDS
    try:
        payload = signing.loads(state, salt=_SALT, max_age=max_age)
    except signing.SignatureExpired:
        raise InvalidParams(
            "requestState has expired: call again without requestState and inputResponses",
            data={"reason": "request_state_expired"},
        ) from None
    except signing.BadSignature:
        raise InvalidParams(
            "requestState failed its integrity check: echo it exactly as the server sent it",
            data={"reason": "request_state_invalid"},
        ) from None
    if (
        not isinstance(payload, dict)
        or payload.get("c") != client.pk
        or payload.get("s") != subject
        or payload.get("f") != arguments_fp
    ):
        raise InvalidParams(
            "requestState was issued for another call (client, name or arguments differ)",
            data={"reason": "request_state_mismatch"},
        )
    answers = payload.get("a")
    return answers if isinstance(answers, dict) else {}


def input_required(
    requests: dict[str, dict[str, Any]],
    *,
    client: Client,
    subject: str,
    arguments_fp: str,
    answers: dict[str, Any],
) -> dict[str, Any]:
    return {
        "resultType": "input_required",
        "inputRequests": requests,
        "requestState": seal(
            client=client, subject=subject, arguments_fp=arguments_fp, answers=answers
        ),
    }
