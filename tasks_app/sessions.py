"""Sessions of the 2025-11-25 handshake wire, in the database.

``open_session`` records what ``initialize`` negotiated; ``live_session`` finds a client's
session by its ``Mcp-Session-Id`` and forgets it once it has been idle longer than
``TASKDESK_SESSION_IDLE_SECONDS``; ``end_session`` is ``DELETE``. A session is a view of its
client: tasks and idempotency keys belong to the client, so they outlive every session.

Replies (``McpReply``) are the client's JSON-RPC responses to requests the server sent on a
session's stream; whichever web process receives the POST stores them, and the process that
asked reads them. A ``notifications/cancelled`` is kept in the shared cache
(``cancel_request``) for the process that runs the request to see at its next check.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from tasks_app.models import Client, McpReply, McpSession


def _idle() -> timedelta:
    return timedelta(seconds=settings.TASKDESK_SESSION_IDLE_SECONDS)


def open_session(
    *, client: Client, protocol_version: str, capabilities: dict[str, Any], client_info: Any
) -> McpSession:
    now = timezone.now()
    return McpSession.objects.create(
        client=client,
        protocol_version=protocol_version,
        capabilities=capabilities,
        client_info=client_info if isinstance(client_info, dict) else {},
        created_at=now,
        last_seen_at=now,
    )


def live_session(*, client: Client, session_id: str) -> McpSession | None:
    """CLIENT's session SESSION_ID, or None when it is unknown, another client's, ended or
    idle for longer than the limit (an expired session is deleted here)."""
    session = McpSession.objects.filter(pk=session_id, client=client).first()
    if session is None:
        return None
    now = timezone.now()
    idle = _idle()
    if now - session.last_seen_at > idle:
        McpSession.objects.filter(pk=session.pk).delete()
        return None
    # Refresh the idle clock at most every tenth of the limit (and at most once a minute), so
    # a busy session costs one write per interval, not one per request.
    if now - session.last_seen_at > min(idle / 10, timedelta(minutes=1)):
        McpSession.objects.filter(pk=session.pk).update(last_seen_at=now)
        session.last_seen_at = now
    return session


def end_session(session: McpSession) -> None:
    McpSession.objects.filter(pk=session.pk).delete()


def set_log_level(session: McpSession, level: str) -> None:
    McpSession.objects.filter(pk=session.pk).update(log_level=level)
    session.log_level = level


def purge_idle(now: Any = None) -> int:
    """Delete every session idle for longer than the limit; return how many."""
    cutoff = (now or timezone.now()) - _idle()
    deleted, _ = McpSession.objects.filter(last_seen_at__lt=cutoff).delete()
    return int(deleted)


def store_reply(*, session: McpSession, request_id: str, body: dict[str, Any]) -> bool:
    """Keep the client's response to the server's request REQUEST_ID; False if one is there
    already (the first one counts)."""
    try:
        with transaction.atomic():
            McpReply.objects.create(
                session=session, request_id=request_id, body=body, created_at=timezone.now()
            )
    except IntegrityError:
        return False
    return True


def take_replies(*, session_id: str, request_ids: list[str]) -> dict[str, dict[str, Any]]:
    """The stored replies among REQUEST_IDS, removed as they are read."""
    rows = list(McpReply.objects.filter(session_id=session_id, request_id__in=request_ids))
    if rows:
        McpReply.objects.filter(pk__in=[r.pk for r in rows]).delete()
    return {r.request_id: r.body for r in rows}


# --- requests the client cancelled (notifications/cancelled) ---------------------------------

# How long a cancellation is remembered: longer than any request of a session can run.
CANCEL_TTL_SECONDS = 3600
CANCEL_CHECK_SECONDS = 0.25


def _cancel_key(session_id: str, request_id: str | int) -> str:
    return f"taskdesk:mcp-cancel:{session_id}:{request_id!r}"


def cancel_request(*, session_id: str, request_id: str | int) -> None:
    """Remember that the client cancelled its request REQUEST_ID, in the shared cache, so that
    whichever web process runs the request sees it."""
    from django.core.cache import cache

    cache.set(_cancel_key(session_id, request_id), True, CANCEL_TTL_SECONDS)


def request_cancelled(*, session_id: str, request_id: str | int) -> bool:
    """Whether the client cancelled REQUEST_ID (False when the cache cannot say: a cache
    outage must not stop the requests that are running)."""
    from django.core.cache import cache

    try:
        return bool(cache.get(_cancel_key(session_id, request_id)))
    except Exception:
        return False


def cancel_check(*, session_id: str, request_id: str | int) -> Callable[[], bool]:
    """A check that answers True once the client has cancelled REQUEST_ID; it asks the cache
    at most every CANCEL_CHECK_SECONDS (a tool's checkpoints can come much faster)."""
    asked = [0.0]

    def check() -> bool:
        now = time.monotonic()
        if now - asked[0] < CANCEL_CHECK_SECONDS:
            return False
        asked[0] = now
        return request_cancelled(session_id=session_id, request_id=request_id)

    return check
