"""How long tasks (and so their idempotency keys) are kept, and purging them afterwards.

A task is kept for its TTL (the tool's ``ttl`` or ``TASKDESK_TASK_TTL_SECONDS``, counted from
creation and shown to clients as ``ttlMs``) plus ``TASKDESK_PURGE_GRACE_SECONDS``; that
moment is stored in ``Task.expires_at``. Its idempotency key lives exactly as long: once the
task is purged, the same key creates a new task. docs/idempotency.md states the window.

Retention never undoes idempotency: a task with an effect in ``intended`` or ``unknown``
(nobody knows whether it happened) is never purged, so its key stays reserved and a retry
cannot do the effect again; it is purged on a later run once the effect has settled (an
operator reconciles it). Every purged task leaves a ``PurgedTask`` archive line (id, key,
client, outcome), written in the transaction that deletes it. Deleting a task frees the
bytes it kept: the purge drops the stored-bytes figures of the clients it purged
(``tasks_app.storage``), so their next call counts again.

The audit log keeps each entry ``TASKDESK_AUDIT_RETENTION_DAYS`` (``purge_audit``), whatever
became of the tasks it names.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef, QuerySet
from django.utils import timezone

from tasks_app import storage, transitions
from tasks_app.models import (
    TERMINAL_STATUSES,
    Actor,
    AuditEntry,
    Effect,
    EffectState,
    EventKind,
    PurgedTask,
    Task,
    event,
)

# Effects whose outcome nobody knows yet: their task (and so its key) is kept.
UNSETTLED = (EffectState.INTENDED, EffectState.UNKNOWN)

log = logging.getLogger(__name__)


def expiry_for(ttl_ms: int | None) -> timedelta | None:
    """The purge moment relative to creation: TTL plus the grace period (None = never)."""
    if ttl_ms is None:
        return None
    return timedelta(milliseconds=ttl_ms) + timedelta(seconds=settings.TASKDESK_PURGE_GRACE_SECONDS)


def _unsettled_effect() -> Exists:
    return Exists(Effect.objects.filter(task=OuterRef("pk"), state__in=UNSETTLED))


def held_back(*, now: datetime | None = None) -> QuerySet[Task]:
    """Finished tasks past their purge moment that are kept because an effect of theirs is
    ``intended`` or ``unknown``: an operator reconciles those effects, then they go."""
    now = now or timezone.now()
    return Task.objects.filter(expires_at__lte=now, status__in=TERMINAL_STATUSES).filter(
        _unsettled_effect()
    )


def purge_audit(*, batch: int = 5000, now: datetime | None = None) -> int:
    """Delete audit entries older than TASKDESK_AUDIT_RETENTION_DAYS, BATCH at a time (short
    transactions); return how many."""
    cutoff = (now or timezone.now()) - timedelta(days=settings.TASKDESK_AUDIT_RETENTION_DAYS)
    deleted = 0
    while True:
        ids = list(AuditEntry.objects.filter(at__lt=cutoff).values_list("pk", flat=True)[:batch])
        if not ids:
            return deleted
        deleted += AuditEntry.objects.filter(pk__in=ids).delete()[0]


def purge_expired(*, batch: int = 1000, now: datetime | None = None) -> int:
    """Delete the finished tasks whose purge moment has passed, with everything recorded about
    them (events, journal, effects, dispatch records, input requests), and so free their keys;
    leave an archive line (``PurgedTask``) for each.

    A task with an effect in ``intended`` or ``unknown`` is not purged (its key stays
    reserved until the effect settles). A task still running at its purge moment is failed
    first (its work outlived the time it was allowed) and kept for one more grace period, so
    its client can read that outcome. Return how many tasks were deleted.
    """
    now = now or timezone.now()
    expire_unfinished(now=now)
    total = 0
    purged_clients: set[int] = set()
    while True:
        with transaction.atomic():
            tasks = list(
                Task.objects.filter(expires_at__lte=now, status__in=TERMINAL_STATUSES)
                .exclude(_unsettled_effect())
                .select_related("client")
                .select_for_update(of=("self",))
                .only(
                    "pk", "idempotency_key", "client__name", "tool_name", "status", "result",
                    "created_at", "finished_at",
                )[:batch]
            )  # fmt: skip
            if not tasks:
                break
            PurgedTask.objects.bulk_create(
                [
                    PurgedTask(
                        task_id=task.pk,
                        idempotency_key=task.idempotency_key,
                        client_id=task.client_id,
                        client_name=task.client.name,
                        tool_name=task.tool_name,
                        status=task.status,
                        is_error=bool((task.result or {}).get("isError")),
                        created_at=task.created_at,
                        finished_at=task.finished_at,
                        purged_at=now,
                    )
                    for task in tasks
                ],
                ignore_conflicts=True,  # a line already archived (a purge run twice) stays
            )
            Task.objects.filter(pk__in=[task.pk for task in tasks]).delete()  # rows cascade
        total += len(tasks)
        purged_clients.update(task.client_id for task in tasks)
    storage.forget(purged_clients)
    if total:
        log.info("purged %s expired tasks", total)
    kept = held_back(now=now).count()
    if kept:
        log.warning(
            "kept %s expired tasks whose effects are intended or unknown: reconcile them", kept
        )
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
