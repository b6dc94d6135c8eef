"""The scope each message to /mcp needs (docs/clients.md, "Scopes"), checked by the transport
before either era sees the message, so both wires refuse alike (403 ``insufficient_scope``).

``tasks:call`` covers calling tools, following, listing and cancelling one's own tasks and
everything read-only; ``tasks:answer`` covers answering the questions a task routes to its
client: ``tasks/update`` on the 2026-07-28 wire, and on the 2025-11-25 wire the client's
responses to a task's ``elicitation/create`` (ids ``taskdesk-q:...``). The answers a
synchronous call collects in its own rounds (a retried ``tools/call`` with
``inputResponses``, or the responses to its ``taskdesk-s:...`` requests) are part of that
call, and need what the call needs.
"""

from __future__ import annotations

from typing import Any

from tasks_app.mcp.handlers.handshake import QUESTION_ID_PREFIX
from tasks_app.oauth.access import ANSWER, CALL

# Every method either wire serves (tests/tasks_app/oauth/test_scopes.py keeps this table in
# step with the method registries).
METHOD_SCOPES: dict[str, str] = {
    # Both wires.
    "tools/list": CALL,
    "tools/call": CALL,
    "prompts/list": CALL,
    "prompts/get": CALL,
    "resources/list": CALL,
    "resources/templates/list": CALL,
    "resources/read": CALL,
    "completion/complete": CALL,
    "tasks/get": CALL,
    "tasks/cancel": CALL,
    # 2026-07-28.
    "server/discover": CALL,
    "subscriptions/listen": CALL,
    "tasks/update": ANSWER,
    # 2025-11-25.
    "initialize": CALL,
    "ping": CALL,
    "logging/setLevel": CALL,
    "resources/subscribe": CALL,
    "resources/unsubscribe": CALL,
    "tasks/list": CALL,
    "tasks/result": CALL,
}


def needed(message: dict[str, Any]) -> str:
    """The scope MESSAGE (a JSON-RPC request, notification or response) needs."""
    method = message.get("method")
    if method is not None:
        # A method neither wire has needs what reading does: its answer is -32601.
        return METHOD_SCOPES.get(method, CALL) if isinstance(method, str) else CALL
    reply_id = message.get("id")
    if isinstance(reply_id, str) and reply_id.startswith(QUESTION_ID_PREFIX):
        return ANSWER
    return CALL
