"""Getting "run this task now" to a worker without ever losing it.

The caller's transaction writes a ``Dispatch`` row; after commit the row is published by job
name (``send_task``), so neither ``transitions`` nor ``acceptance`` imports the Celery jobs.
Whatever was not published (broker down, process killed between commit and publish) is
published by the periodic sweeper. Duplicated messages are harmless: a leg takes a lease.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from tasks_app.models import Dispatch, Task

log = logging.getLogger(__name__)

RUN_TASK_JOB = "run_task_job"

# Publishing happens on the request path: fail fast when the broker is down and leave the
# record to the sweeper, instead of holding the client's receipt hostage.
_FAST_RETRY = {"max_retries": 0, "interval_start": 0, "interval_step": 0.1, "interval_max": 0.1}


def enqueue(task: Task, *, reason: str) -> Dispatch:
    """Record that TASK needs a leg, and publish the record once the transaction commits."""
    record = Dispatch.objects.create(task=task, reason=reason)
    transaction.on_commit(lambda: publish(record.pk, task.pk))
    return record


def publish(dispatch_id: int, task_id: str) -> bool:
    """Send one record to the broker and mark it published. Return False if the broker failed."""
    from config.celery import app

    try:
        app.send_task(
            RUN_TASK_JOB,
            kwargs={"task_id": task_id, "dispatch_id": dispatch_id},
            retry=True,
            retry_policy=_FAST_RETRY,
        )
    except Exception as exc:  # any broker/transport failure: the sweeper retries
        log.warning("dispatch %s of task %s not published: %s", dispatch_id, task_id, exc)
        Dispatch.objects.filter(pk=dispatch_id).update(attempts=F("attempts") + 1)
        return False
    Dispatch.objects.filter(pk=dispatch_id, published_at__isnull=True).update(
        published_at=timezone.now(), attempts=F("attempts") + 1
    )
    return True


def publish_pending(*, limit: int = 500) -> int:
    """Publish records still unpublished after the grace period. Return how many went out."""
    cutoff = timezone.now() - timedelta(seconds=settings.TASKDESK_DISPATCH_GRACE_SECONDS)
    pending = list(
        Dispatch.objects.filter(published_at__isnull=True, created_at__lte=cutoff)
        .order_by("created_at")
        .values_list("pk", "task_id")[:limit]
    )
    sent = 0
    for dispatch_id, task_id in pending:
        if not publish(dispatch_id, task_id):
            break  # the broker is still down; try again on the next sweep
        sent += 1
    return sent
