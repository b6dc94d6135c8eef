"""Sessions of the 2025-11-25 handshake wire, in the database.

``open_session`` records what ``initialize`` negotiated; ``live_session`` finds a client's
session by its ``Mcp-Session-Id`` and forgets it once it has been idle longer than
``TASKDESK_SESSION_IDLE_SECONDS``; ``end_session`` is ``DELETE``. A session is a view of its
client: tasks and idempotency keys belong to the client, so they outlive every session.

Replies (``McpReply``) are the client's JSON-RPC responses to requests the server sent on a
session's stream. The process that sends such a request first records its id as awaited
(``await_replies``: a row with no body); whichever web process receives the POST fills that
row (``store_reply``), and the process that asked reads it (``take_replies``) and forgets
what is left when it stops waiting (``forget_replies``). A response whose id the session is
not waiting for is dropped, so a client cannot make the server keep what nobody reads.

A client keeps at most ``TASKDESK_MAX_SESSIONS_PER_CLIENT`` sessions: ``open_session`` of
one more forgets the client's least recently used one(s) first (never a refusal; a client
still using a forgotten session gets 404 and initializes again, as the transport says). A ``notifications/cancelled`` is kept in the shared cache
(``cancel_request``) for the process that runs the request to see at its next check.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from tasks_app.models import Client, McpReply, McpSession

log = logging.getLogger("tasks_app.sessions")


def _idle() -> timedelta:
    return timedelta(seconds=settings.TASKDESK_SESSION_IDLE_SECONDS)


def open_session(
    *, client: Client, protocol_version: str, capabilities: dict[str, Any], client_info: Any
) -> McpSession:
    with transaction.atomic():
        _make_room(client)
        now = timezone.now()
        return McpSession.objects.create(
            client=client,
            protocol_version=protocol_version,
            capabilities=capabilities,
            client_info=client_info if isinstance(client_info, dict) else {},
            created_at=now,
            last_seen_at=now,
        )


def _make_room(client: Client) -> int:
    """Forget CLIENT's least recently used sessions until one more fits under the cap; return
    how many went. The client's row is locked first, so that racing initializes of one client
    cannot together pass the cap (other clients are not held up)."""
    cap = settings.TASKDESK_MAX_SESSIONS_PER_CLIENT
    if not cap:
        return 0
    # FOR NO KEY UPDATE: initializes of one client wait for each other, while the client's
    # task inserts (which take FOR KEY SHARE on it through the foreign key) do not.
    list(
        Client.objects.select_for_update(no_key=True)
        .filter(pk=client.pk)
        .values_list("pk", flat=True)
    )
    oldest = list(
        McpSession.objects.filter(client=client)
        .order_by("-last_seen_at", "-created_at")
        .values_list("pk", flat=True)[cap - 1 :]
    )
    if not oldest:
        return 0
    McpSession.objects.filter(pk__in=oldest).delete()
    log.info(
        "client %s is at its %d sessions (TASKDESK_MAX_SESSIONS_PER_CLIENT): forgot the %d "
        "least recently used",
        client.name,
        cap,
        len(oldest),
    )
    return len(oldest)


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


def await_replies(*, session_id: str, request_ids: list[str]) -> None:
    """Record that the server is about to send the requests REQUEST_IDS on SESSION_ID and
    waits for their responses (before sending them, so that no response comes too early)."""
    now = timezone.now()
    McpReply.objects.bulk_create(
        [McpReply(session_id=session_id, request_id=rid, created_at=now) for rid in request_ids]
    )


def store_reply(*, session: McpSession, request_id: str, body: dict[str, Any]) -> bool:
    """Keep the client's response to the server's request REQUEST_ID if the session is
    waiting for it; False when it is not (an id the server never sent, or sent and no longer
    waits for) or when it has one already (the first one counts). Nothing is kept then."""
    kept = McpReply.objects.filter(
        session=session, request_id=request_id, body__isnull=True
    ).update(body=body, created_at=timezone.now())
    return bool(kept)


def take_replies(*, session_id: str, request_ids: list[str]) -> dict[str, dict[str, Any]]:
    """The stored replies among REQUEST_IDS, removed as they are read."""
    rows = list(
        McpReply.objects.filter(
            session_id=session_id, request_id__in=request_ids, body__isnull=False
        )
    )
    if rows:
        McpReply.objects.filter(pk__in=[r.pk for r in rows]).delete()
    return {r.request_id: r.body for r in rows if r.body is not None}


def forget_replies(*, session_id: str, request_ids: list[str]) -> None:
    """Stop waiting for REQUEST_IDS: a response that comes later is dropped."""
    McpReply.objects.filter(session_id=session_id, request_id__in=request_ids).delete()


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
