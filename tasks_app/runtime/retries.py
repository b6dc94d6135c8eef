"""Steps and effect bodies waiting to be retried: their next legs are dispatched when the wait is over.

A step whose attempt failed with a retryable error keeps a journal entry whose outcome holds
the failed attempts and ``retry_at`` (see ``context.TaskContext.step``); its leg ended and
released the lease, so the worker runs other tasks meanwhile. The leg that scheduled the
retry also sent a countdown message (``dispatch.publish_later``); whichever comes first, that
message or the sweeper, dispatches the next leg here once ``retry_at`` has passed (a message
that arrives early, on a host whose clock is ahead, dispatches nothing: the sweeper will).
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from tasks_app import dispatch
from tasks_app.models import Dispatch, JournalEntry, JournalKind, Status, Task

RETRY_AT = "retry_at"
ATTEMPTS = "attempts"


def _retry_at(entry: JournalEntry) -> datetime:
    outcome = entry.outcome if isinstance(entry.outcome, dict) else {}
    return datetime.fromisoformat(str(outcome[RETRY_AT]))


def retry_due_at(task_id: str) -> datetime | None:
    """When the step TASK_ID waits to retry runs again (None if none waits)."""
    entry = JournalEntry.objects.filter(task_id=task_id, outcome__has_key=RETRY_AT).first()
    return _retry_at(entry) if entry is not None else None


def dispatch_due_retries(*, task_id: str | None = None, now: datetime | None = None) -> int:
    """Dispatch a leg for every working task (TASK_ID only, when given) whose step waits to
    be retried and is due, unless a leg holds the task or a dispatch already waits for one.
    Return how many legs were dispatched."""
    now = now or timezone.now()
    waiting = JournalEntry.objects.filter(
        kind__in=(JournalKind.STEP, JournalKind.EFFECT),
        outcome__has_key=RETRY_AT,
        task__status=Status.WORKING,
    )
    if task_id is not None:
        waiting = waiting.filter(task_id=task_id)
    due = {entry.task_id for entry in waiting.only("task_id", "outcome") if _retry_at(entry) <= now}
    dispatched = 0
    for due_task in sorted(due):
        with transaction.atomic():
            task = Task.objects.select_for_update().filter(pk=due_task).first()
            if task is None or task.status != Status.WORKING or task.lease_owner:
                continue
            if Dispatch.objects.filter(task=task, consumed_at__isnull=True).exists():
                continue
            dispatch.enqueue(task, reason="retry")
            dispatched += 1
    return dispatched
