"""Running a tool function or prompt inside the request, with MRTR rounds (SEP-2322).

Each run holds one of the process's synchronous slots (``limits.sync_slots``) from start to
end, the thread of a streamed run included: a call that finds none free is refused at once
with 429 ``busy``. A run stops at its next checkpoint once the client is gone or once it has
run ``TASKDESK_SYNC_MAX_SECONDS`` (``sync.TimeUp``; handlers turn it into ``limits.time_up``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.conf import settings

from tasks_app import sessions
from tasks_app.mcp import limits, mrtr
from tasks_app.mcp.errors import from_code
from tasks_app.mcp.registry import Call
from tasks_app.mcp.streaming import Emit, Streamed
from tasks_app.mcp.sync import NeedInput, SyncContext
from tasks_app.tools import ProtocolError

Body = Callable[[SyncContext], dict[str, Any]]


def run(
    call: Call, *, subject: str, arguments_fp: str, body: Body, can_escalate: bool = False
) -> dict[str, Any] | Streamed:
    """Run BODY with a SyncContext holding every answer of earlier rounds.

    A question still unanswered ends the round with an ``InputRequiredResult``. The call
    streams (SSE) only if the request asked for progress or log notifications.
    """
    answers = dict(call.data.get("inputResponses") or {})
    state = call.data.get("requestState")
    if state:
        # Answers of earlier rounds come from the signed state and are not replaced by the
        # client's new responses.
        answers.update(
            mrtr.unseal(state, client=call.client, subject=subject, arguments_fp=arguments_fp)
        )

    disconnected = _stopped(call)

    def go(emit: Emit | None, cancelled: threading.Event | None) -> dict[str, Any]:
        ctx = SyncContext(
            client=call.client,
            envelope=call.envelope,
            name=subject,
            answers=answers,
            can_escalate=can_escalate,
            emit=emit,
            cancelled=cancelled,
            disconnected=disconnected,
            max_seconds=settings.TASKDESK_SYNC_MAX_SECONDS,
        )
        try:
            return body(ctx)
        except NeedInput as need:
            return mrtr.input_required(
                need.requests,
                client=call.client,
                subject=subject,
                arguments_fp=arguments_fp,
                answers=ctx.used,
            )
        except ProtocolError as exc:
            raise from_code(exc.code, str(exc), exc.data) from exc

    release = limits.sync_slots.take(client=call.client.pk)
    if call.envelope.progress_token is not None or call.envelope.log_level is not None:
        return Streamed(go, release=release)  # the stream's thread gives the slot back
    try:
        return go(None, None)
    finally:
        release()


def _stopped(call: Call) -> Callable[[], bool]:
    """The check a run makes at its checkpoints: the client closed the connection, or (on
    the handshake wire) sent ``notifications/cancelled`` for this request."""
    gone = limits.disconnected(call.request)
    if call.session is None:
        return gone
    withdrawn = sessions.cancel_check(session_id=call.session.pk, request_id=call.id)
    return lambda: gone() or withdrawn()
