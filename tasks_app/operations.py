"""An operator's actions on one task, each with its audit entry in the action's transaction:
cancel a task, settle an unknown effect. The task page, the operator API and ``manage.py
tasks`` all act through these; a refusal is audited too (nothing changed, and why)."""

from __future__ import annotations

from functools import partial
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction

from tasks_app import audit, runtime, transitions
from tasks_app.models import Actor, AuditAction, AuditOutcome, Effect, Task


class Ended(ValueError):
    """The task has already ended: there is nothing to cancel."""


def cancel_task(task: Task, who: audit.Who, **detail: Any) -> None:
    """Request cancellation of TASK as WHO (as ``tasks/cancel`` does). Raise Ended, after
    auditing the refusal, when it has already ended. DETAIL goes into the audit entry."""
    cancelled = partial(audit.record, who, AuditAction.TASK_CANCEL,
                        tenant=task.client.tenant_id, target=f"task:{task.pk}", **detail)  # fmt: skip
    if task.is_terminal:
        why = f"The task has already ended ({task.status})."
        cancelled(outcome=AuditOutcome.REFUSED, reason=why)
        raise Ended(why)
    with transaction.atomic():
        transitions.request_cancel(task_id=task.pk, actor_type=Actor.OPERATOR, actor=who.actor)
        cancelled()


def settle_effect(
    effect: Effect, who: audit.Who, *, happened: bool, note: str, **detail: Any
) -> None:
    """Record WHO's word on an unknown EFFECT (``runtime.reconcile_effect``). Raise
    ``runtime.NotReconcilable``, after auditing the refusal, when it cannot be settled."""
    settled = partial(audit.record, who, AuditAction.EFFECT_SETTLE,
                      tenant=effect.task.client.tenant_id, target=f"effect:{effect.pk}",
                      task=effect.task_id, effect=effect.name, happened=happened, note=note,
                      **detail)  # fmt: skip
    user = who.user if who.user is not None else User(username=who.actor)
    try:
        with transaction.atomic():
            runtime.reconcile_effect(effect_id=effect.pk, happened=happened, user=user, note=note)
            settled()
    except runtime.NotReconcilable as exc:
        settled(outcome=AuditOutcome.REFUSED, reason=str(exc))
        raise
