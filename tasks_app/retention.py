"""How long tasks (and so their idempotency keys) are kept, and purging them afterwards.

A task is kept for its TTL (the tool's ``ttl`` or ``TASKDESK_TASK_TTL_SECONDS``, counted from
creation and shown to clients as ``ttlMs``) plus ``TASKDESK_PURGE_GRACE_SECONDS``; that
moment is stored in ``Task.expires_at``. Its idempotency key lives exactly as long: once the
task is purged, the same key creates a new task. docs/idempotency.md states the window.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from tasks_app import transitions
from tasks_app.models import TERMINAL_STATUSES, Actor, EventKind, Task, event

log = logging.getLogger(__name__)


def expiry_for(ttl_ms: int | None) -> timedelta | None:
    """The purge moment relative to creation: TTL plus the grace period (None = never)."""
    if ttl_ms is None:
        return None
    return timedelta(milliseconds=ttl_ms) + timedelta(seconds=settings.TASKDESK_PURGE_GRACE_SECONDS)


def purge_expired(*, batch: int = 1000, now: datetime | None = None) -> int:
    """Delete the finished tasks whose purge moment has passed, with everything recorded about
    them (events, journal, effects, dispatch records, input requests), and so free their keys.

    A task still running at its purge moment is failed first (its work outlived the time it
    was allowed) and kept for one more grace period, so its client can read that outcome.
    Return how many tasks were deleted.
    """
    now = now or timezone.now()
    expire_unfinished(now=now)
    total = 0
    while True:
        ids = list(
            Task.objects.filter(expires_at__lte=now, status__in=TERMINAL_STATUSES).values_list(
                "pk", flat=True
            )[:batch]
        )
        if not ids:
            break
        Task.objects.filter(pk__in=ids).delete()  # the related rows cascade
        total += len(ids)
    if total:
        log.info("purged %s expired tasks", total)
    return total


def expire_unfinished(*, now: datetime) -> int:
    """Fail the running tasks whose purge moment has passed; keep them one more grace period."""
    ids = list(
        Task.objects.filter(expires_at__lte=now)
        .exclude(status__in=TERMINAL_STATUSES)
        .values_list("pk", flat=True)
    )
    grace = timedelta(seconds=settings.TASKDESK_PURGE_GRACE_SECONDS)
    expired = 0
    for task_id in ids:
        with transaction.atomic():
            try:
                task = transitions.fail(
                    task_id=task_id,
                    error={
                        "code": -32603,
                        "message": "The task expired: it did not finish within its time to live.",
                    },
                    actor_type=Actor.SYSTEM,
                    actor="retention",
                )
            except (Task.DoesNotExist, transitions.InvalidTransition):
                continue  # finished or purged meanwhile
            task.expires_at = now + grace
            task.save(update_fields=["expires_at", "updated_at"])
            event(
                task,
                EventKind.EXPIRED,
                actor_type=Actor.SYSTEM,
                actor="retention",
                ttl_ms=task.ttl_ms,
            )
        expired += 1
    return expired
