"""Bulk actions: "Cancel all matching" and "Settle all matching" on a filtered task list.

An operator (or ``manage.py tasks cancel``) first gets a dry run (``preview``): how many tasks
the list matches, how many would be acted on, how many would be skipped (already ended,
nothing unknown left) or refused (the role in their tenant does not allow it), and the first
rows. Confirming (``start``) records a ``BulkAction`` and its audit entry in one transaction
and hands the action to a control job (``run``), which walks the same list with the same code
as the page, BATCH tasks a transaction, recording what it did to each task (a
``BulkActionTask``), naming the action in each task's timeline, and writing its progress
after every batch. Only tasks created up to the confirmation match; only tasks the operator
may see are ever read, and only those whose tenant lets their role act are acted on.

A job runs for at most half the control jobs' soft time limit, then queues its own next run;
a job whose worker died is taken up again by the sweeper (``revive_stalled``). A batch is one
transaction, so a batch cut short is done again whole, never twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from elicitations.selectors import overdue_task_ids
from tasks_app import audit, listing, operators, rerun, runtime, selectors, transitions
from tasks_app.acceptance import AcceptanceError
from tasks_app.listing import ListCursor, Outcome, TaskFilters
from tasks_app.listing.query import DEFAULT_SORT, moment_of
from tasks_app.models import (
    TERMINAL_STATUSES,
    Actor,
    AuditAction,
    BulkAction,
    BulkActionTask,
    BulkItemOutcome,
    BulkKind,
    BulkState,
    Client,
    Effect,
    EffectState,
    Task,
)

log = logging.getLogger(__name__)

BATCH = 200  # tasks a transaction
SAMPLE = 20  # rows the dry run shows
CONFIRM_OVER = 100  # past this many tasks, the operator types the count
MAX_TASKS = 100_000  # a bulk action matches at most this many tasks: narrow the filter
BULK_ACTION_JOB = "bulk_action_job"
PERMISSION = {
    BulkKind.CANCEL: operators.CANCEL_TASKS,
    BulkKind.SETTLE: operators.RECONCILE_EFFECTS,
    BulkKind.RERUN: operators.RERUN_TASKS,
}
# Why a role may not start each kind (the console and the API say the same).
NOT_PERMITTED = {
    BulkKind.CANCEL: "Your role does not allow cancelling tasks.",
    BulkKind.SETTLE: "Your role does not allow settling effects.",
    BulkKind.RERUN: "Your role does not allow running tasks again.",
}
# Run all matching again: the choices of reuse as a form or a command line gives them.
REUSE = {"default": None, "yes": True, "no": False}
AUDIT_ACTION = {
    BulkKind.CANCEL: AuditAction.BULK_CANCEL,
    BulkKind.SETTLE: AuditAction.BULK_SETTLE,
    BulkKind.RERUN: AuditAction.BULK_RERUN,
}
# The task columns a bulk action reads (the list's order and what a dry run's rows show).
FIELDS = listing.RECORD_FIELDS


class TooMany(ValueError):
    """The list matches more than MAX_TASKS tasks."""


class NotApplicable(ValueError):
    """The action does not apply to this list (settling needs a list of unknown effects)."""


def may(user: Any, kind: str) -> bool:
    """Whether USER may start KIND at all (their role allows it in some tenant)."""
    return operators.may(user, PERMISSION[BulkKind(kind)])


def applies(kind: str, filters: TaskFilters) -> str:
    """Why KIND does not apply to the list FILTERS make ("" when it does). Settling needs the
    attention list or the unknown-effect outcome: the tasks waiting on an operator's word;
    running again, a list of finished tasks (a final status, or a completed outcome)."""
    if kind == BulkKind.SETTLE and not (
        filters.attention or filters.outcome == Outcome.UNKNOWN_EFFECT
    ):
        return "Settle all matching applies to the Needs attention list (or the unknown-effect outcome)."
    if kind == BulkKind.RERUN and not (
        filters.status in TERMINAL_STATUSES or filters.outcome in (Outcome.OK, Outcome.TOOL_ERROR)
    ):
        return (
            "Run all matching again applies to a list of finished tasks: filter by a final status."
        )
    return ""


# --- the dry run ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Preview:
    kind: str
    until: datetime
    matched: int
    act: int  # would be cancelled, or would have their unknown effects settled
    skipped: int  # already ended, or nothing unknown left
    refused: int  # the role in the task's tenant does not allow it
    first: list[Task]

    @property
    def needs_typed_count(self) -> bool:
        return self.matched > CONFIRM_OVER


def preview(*, user: Any, kind: str, filters: TaskFilters, tenant: str = "") -> Preview:
    """What KIND would do to the list FILTERS make for USER now (TENANT: one tenant's slug).
    Raise TooMany past MAX_TASKS tasks, NotApplicable when the action does not apply."""
    why = applies(kind, filters)
    if why:
        raise NotApplicable(why)
    until = timezone.now()
    counts = dict.fromkeys(BulkItemOutcome.values, 0)
    first: list[Task] = []
    matched = 0
    allowed = _Allowed(user, kind)
    for batch, _ in _pages(user=user, filters=filters, until=until, tenant=tenant):
        unknown = _waiting_effects(kind, batch)
        for task in batch:
            matched += 1
            if matched > MAX_TASKS:
                raise TooMany(f"More than {MAX_TASKS:,} tasks match: narrow the filter.")
            counts[_judge(kind, task, allowed, unknown)[0]] += 1
            if len(first) < SAMPLE:
                first.append(task)
    return Preview(
        kind=kind,
        until=until,
        matched=matched,
        act=counts[BulkItemOutcome.DONE],
        skipped=counts[BulkItemOutcome.SKIPPED],
        refused=counts[BulkItemOutcome.REFUSED],
        first=first,
    )


# --- starting and running --------------------------------------------------------------------


def start(
    who: audit.Who,
    *,
    kind: str,
    filters: TaskFilters,
    until: datetime,
    expected: int,
    tenant: str = "",
    from_shell: bool = False,
    happened: bool | None = None,
    note: str = "",
    reuse: bool | None = None,
    queue: bool = True,
) -> BulkAction:
    """Record the bulk action and its audit entry, and (QUEUE) hand it to a control job once
    committed. UNTIL is the dry run's moment: only tasks created by then match."""
    with transaction.atomic():
        bulk = BulkAction.objects.create(
            kind=kind,
            user=who.user if who.user is not None and who.user.is_authenticated else None,
            actor=who.actor,
            from_shell=from_shell,
            tenant=tenant,
            query=filters.query(),
            until=until,
            expected=expected,
            happened=happened,
            note=note,
            reuse=reuse,
            touched_at=timezone.now(),
        )
        detail: dict[str, Any] = {"query": bulk.query, "expected": expected}
        if kind == BulkKind.SETTLE:
            detail.update(happened=happened, note=note)
        if kind == BulkKind.RERUN:
            detail.update(reuse=reuse)
        audit.record(who, AUDIT_ACTION[BulkKind(kind)], target=f"bulk:{bulk.pk}", **detail)
        if queue:
            transaction.on_commit(lambda: enqueue(bulk.pk))
    return bulk


def enqueue(bulk_id: int) -> None:
    from celery import current_app

    current_app.send_task(BULK_ACTION_JOB, args=[bulk_id], queue=settings.TASKDESK_CONTROL_QUEUE)


def run(bulk_id: int, *, seconds: float | None = None) -> bool:
    """Go on with bulk action BULK_ID for up to SECONDS (None: to the end); return whether it
    has finished."""
    deadline = None if seconds is None else time.monotonic() + seconds
    bulk = BulkAction.objects.get(pk=bulk_id)
    if bulk.finished:
        return True
    user = _acting_user(bulk)
    if user is None:
        _finish(bulk, BulkState.FAILED, error="The operator who started it no longer exists.")
        return True
    if bulk.started_at is None:
        BulkAction.objects.filter(pk=bulk.pk).update(
            state=BulkState.RUNNING, started_at=timezone.now(), touched_at=timezone.now()
        )
    filters = TaskFilters.from_query(bulk.query)
    allowed = _Allowed(user, bulk.kind)
    cursor = ListCursor.decode(bulk.cursor) if bulk.cursor else None
    pages = _pages(user=user, filters=filters, until=bulk.until, tenant=bulk.tenant,
                   cursor=cursor)  # fmt: skip
    at = bulk.cursor
    for batch, following in pages:
        # A run again is accepted in a transaction of its own (acceptance commits): before the
        # batch's. Its key names this action, so a batch done again finds the tasks it made.
        ran = _run_again(bulk, batch, allowed, user) if bulk.kind == BulkKind.RERUN else {}
        with transaction.atomic():
            bulk = BulkAction.objects.select_for_update().get(pk=bulk_id)
            if bulk.cursor != at or bulk.finished:
                return True  # another run of the job (one the sweeper queued) went on with it
            _apply(bulk, batch, allowed, user, ran)
            bulk.cursor = following.encode() if following else ""
            bulk.touched_at = timezone.now()
            bulk.save(update_fields=["matched", "done", "skipped", "refused", "cursor",
                                     "touched_at"])  # fmt: skip
            at = bulk.cursor
        if following is None:
            break
        if deadline is not None and time.monotonic() > deadline:
            return False
    _finish(BulkAction.objects.get(pk=bulk_id), BulkState.DONE)
    return True


def may_see(user: Any, action: BulkAction) -> bool:
    """Who sees a bulk action's progress and record: the operator who started it, and
    superusers (one started from a shell: superusers only)."""
    return bool(user.is_superuser or (action.user_id == user.pk and not action.from_shell))


def revive_stalled(*, now: datetime | None = None) -> int:
    """Queue again every unfinished bulk action that nothing has touched for twice a job's
    time (its worker died, or its message was lost); return how many."""
    now = now or timezone.now()
    stale = now - timedelta(seconds=2 * job_seconds() + 30)
    ids = list(
        BulkAction.objects.filter(
            state__in=[BulkState.QUEUED, BulkState.RUNNING], touched_at__lt=stale, from_shell=False
        ).values_list("pk", flat=True)[:100]
    )
    for bulk_id in ids:
        BulkAction.objects.filter(pk=bulk_id).update(touched_at=now)
        enqueue(bulk_id)
    return len(ids)


def job_seconds() -> float:
    """How long one run of the job goes on before queueing the next: half the soft limit."""
    return min(30.0, settings.TASKDESK_CONTROL_SOFT_TIME_LIMIT_SECONDS / 2)


# --- inside ------------------------------------------------------------------------------------


def _acting_user(bulk: BulkAction) -> Any:
    if bulk.from_shell:
        return User(is_superuser=True, is_active=True)  # every tenant (or bulk.tenant's)
    user = bulk.user
    return user if user is not None and user.is_active else None


class _Allowed:
    """Whether USER's role allows KIND in a task's tenant (its client's, looked up once)."""

    def __init__(self, user: Any, kind: str) -> None:
        tenants = operators.tenants_where(user, PERMISSION[BulkKind(kind)])
        self.tenants = None if tenants is None else set(tenants)
        self.tenant_of: dict[int, int] = {}

    def __call__(self, task: Task) -> bool:
        if self.tenants is None:
            return True
        if task.client_id not in self.tenant_of:
            self.tenant_of.update(Client.objects.values_list("pk", "tenant_id"))
        return self.tenant_of.get(task.client_id) in self.tenants


def _pages(
    *,
    user: Any,
    filters: TaskFilters,
    until: datetime,
    tenant: str = "",
    cursor: ListCursor | None = None,
) -> Iterator[tuple[list[Task], ListCursor | None]]:
    """The list's tasks created up to UNTIL, newest first, BATCH at a time from CURSOR, each
    batch with the cursor of the next (None after the last)."""
    bounded = _bounded(filters, until)
    attention = (
        selectors.attention_filter(overdue_task_ids=overdue_task_ids())
        if bounded.attention
        else None
    )
    unknown = listing.unknown_effects_for(bounded)
    while True:
        page = listing.task_page_for_operator(
            user=user, filters=bounded, cursor=cursor, attention=attention,
            unknown_effects=unknown, size=BATCH, fields=FIELDS, tenant=tenant,
        )  # fmt: skip
        yield page.tasks, page.older
        if page.older is None:
            return
        cursor = page.older


def _bounded(filters: TaskFilters, until: datetime) -> TaskFilters:
    """FILTERS in the list's default order, with tasks created after UNTIL left out."""
    end = moment_of(filters.created_to, end=True) if filters.created_to else None
    created_to = filters.created_to if end is not None and end <= until else until.isoformat()
    return replace(filters, sort=DEFAULT_SORT, created_to=created_to)


def _unknown_effects(tasks: list[Task]) -> dict[str, list[Effect]]:
    """The effects still waiting on an operator's word (unknown, not yet decided) of TASKS."""
    found: dict[str, list[Effect]] = {}
    effects = Effect.objects.filter(task_id__in=[t.pk for t in tasks], state=EffectState.UNKNOWN)
    for effect in effects.order_by("seq"):
        if "reconciled" not in effect.detail:
            found.setdefault(effect.task_id, []).append(effect)
    return found


def _waiting_effects(kind: str, tasks: list[Task]) -> dict[str, list[Effect]]:
    """The effects KIND looks at: for settling, those waiting on an operator's word; for a
    run again, those whose outcome nobody knows (they block it)."""
    if kind == BulkKind.SETTLE:
        return _unknown_effects(tasks)
    if kind == BulkKind.RERUN:
        found: dict[str, list[Effect]] = {}
        effects = Effect.objects.filter(
            task_id__in=[t.pk for t in tasks], state__in=rerun.UNSETTLED
        )
        for effect in effects:
            found.setdefault(effect.task_id, []).append(effect)
        return found
    return {}


def _judge(
    kind: str, task: Task, allowed: _Allowed, unknown: dict[str, list[Effect]]
) -> tuple[str, str]:
    """What KIND would do to TASK: (outcome, reason)."""
    if not allowed(task):
        return BulkItemOutcome.REFUSED, "the role in this tenant does not allow it"
    if kind == BulkKind.CANCEL:
        if task.is_terminal:
            return BulkItemOutcome.SKIPPED, f"already {task.status}"
        return BulkItemOutcome.DONE, ""
    if kind == BulkKind.RERUN:
        if not task.is_terminal:
            return BulkItemOutcome.SKIPPED, f"not finished ({task.status})"
        if unknown.get(task.pk):
            return BulkItemOutcome.SKIPPED, "an effect may or may not have happened: settle it"
        return BulkItemOutcome.DONE, ""
    if not unknown.get(task.pk):
        return BulkItemOutcome.SKIPPED, "no effect waits on an operator"
    return BulkItemOutcome.DONE, ""


def _apply(
    bulk: BulkAction,
    tasks: list[Task],
    allowed: _Allowed,
    user: Any,
    ran: dict[str, tuple[str, str]],
) -> None:
    """Act on one batch (inside the batch's transaction), counting on BULK; RAN: what
    ``_run_again`` did to each task of it."""
    unknown = _unknown_effects(tasks) if bulk.kind == BulkKind.SETTLE else {}
    items = []
    for task in tasks:
        if bulk.kind == BulkKind.RERUN:
            outcome, reason = ran[task.pk]
        else:
            outcome, reason = _judge(bulk.kind, task, allowed, unknown)
        if outcome == BulkItemOutcome.DONE and bulk.kind != BulkKind.RERUN:
            if bulk.kind == BulkKind.CANCEL:
                outcome, reason = _cancel(bulk, task)
            else:
                outcome, reason = _settle(bulk, unknown[task.pk], user)
        items.append(BulkActionTask(bulk=bulk, task_id=task.pk, outcome=outcome, reason=reason))
        bulk.matched += 1
        if outcome == BulkItemOutcome.DONE:
            bulk.done += 1
        elif outcome == BulkItemOutcome.SKIPPED:
            bulk.skipped += 1
        else:
            bulk.refused += 1
    BulkActionTask.objects.bulk_create(items, ignore_conflicts=True)


def _run_again(
    bulk: BulkAction, tasks: list[Task], allowed: _Allowed, user: Any
) -> dict[str, tuple[str, str]]:
    """Run each of TASKS again that may be (outside any transaction: each acceptance commits)."""
    waiting = _waiting_effects(BulkKind.RERUN, tasks)
    who = audit.Who(None if bulk.from_shell else user, bulk.actor)
    done: dict[str, tuple[str, str]] = {}
    for task in tasks:
        outcome, reason = _judge(BulkKind.RERUN, task, allowed, waiting)
        if outcome == BulkItemOutcome.DONE:
            reuse = bulk.reuse if bulk.reuse is not None else rerun.reuses_by_default(task)
            key = rerun.derived_key(task, suffix=f"~bulk-{bulk.pk}")
            try:
                new = rerun.run_again(task, reuse=reuse, who=who, key=key, bulk=bulk.pk)
            except (rerun.NotRerunnable, AcceptanceError) as exc:
                outcome, reason = BulkItemOutcome.SKIPPED, str(exc)[:300]
            else:
                reason = f"ran again as {new.pk}"
        done[task.pk] = (outcome, reason)
    return done


def _cancel(bulk: BulkAction, task: Task) -> tuple[str, str]:
    # The row as it is now, locked: it may have ended since the list was read.
    status = Task.objects.select_for_update().filter(pk=task.pk).values_list("status", flat=True)
    now = status.first()
    if now is None or now in TERMINAL_STATUSES:
        return BulkItemOutcome.SKIPPED, f"already {now or 'purged'}"
    transitions.request_cancel(
        task_id=task.pk, actor_type=Actor.OPERATOR, actor=bulk.actor, bulk=bulk.pk
    )
    return BulkItemOutcome.DONE, ""


def _settle(bulk: BulkAction, effects: list[Effect], user: Any) -> tuple[str, str]:
    decided = 0
    who = user if not bulk.from_shell else User(username=bulk.actor)
    for effect in effects:
        try:
            with transaction.atomic():
                runtime.reconcile_effect(effect_id=effect.pk, happened=bool(bulk.happened),
                                         user=who, note=bulk.note, bulk=bulk.pk)  # fmt: skip
            decided += 1
        except runtime.NotReconcilable:
            continue  # decided meanwhile (by someone else): nothing to do
    if not decided:
        return BulkItemOutcome.SKIPPED, "its effects were settled meanwhile"
    return BulkItemOutcome.DONE, f"{decided} effect(s)"


def _finish(bulk: BulkAction, state: str, *, error: str = "") -> None:
    now = timezone.now()
    BulkAction.objects.filter(pk=bulk.pk).update(
        state=state, error=error, finished_at=now, touched_at=now, cursor=""
    )
    log.info("bulk action %s %s: %s done, %s skipped, %s refused", bulk.pk, state, bulk.done,
             bulk.skipped, bulk.refused)  # fmt: skip
