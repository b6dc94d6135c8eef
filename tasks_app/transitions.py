"""The only code that changes ``Task.status``.

Each function locks the row (``select_for_update``; on SQLite the IMMEDIATE transaction
serializes writers instead), checks the allowed-transition table, saves with
``update_fields``, writes a ``TaskEvent`` in the same transaction and schedules follow-up
work on commit. The MCP handlers, the inbox, the dashboard, the admin and the Celery jobs all
call these functions.

Lock order: a Task row is always locked before any of its InputRequest or Effect rows.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.utils import timezone
from psycopg.types.json import Jsonb

from tasks_app import dispatch, rows
from tasks_app.models import (
    TERMINAL_STATUSES,
    Actor,
    EffectState,
    Status,
    Task,
    TaskEvent,
    event,
)

ALLOWED: dict[str, set[str]] = {
    Status.WORKING: {Status.INPUT_REQUIRED, Status.COMPLETED, Status.FAILED, Status.CANCELLED},
    Status.INPUT_REQUIRED: {Status.WORKING, Status.COMPLETED, Status.FAILED, Status.CANCELLED},
    Status.COMPLETED: set(),
    Status.FAILED: set(),
    Status.CANCELLED: set(),
}


class InvalidTransition(Exception):
    def __init__(self, task: Task, to: str) -> None:
        super().__init__(f"task {task.pk} cannot move from {task.status} to {to}")
        self.task = task
        self.to = to


class LeaseLost(Exception):
    """A leg tried to end a task whose lease another leg holds now (it was presumed dead)."""


def is_allowed(old: str, new: str) -> bool:
    return new in ALLOWED.get(old, set())


def _locked(task_id: str) -> Task:
    return Task.objects.select_for_update().get(pk=task_id)


def _move(
    task: Task,
    to: str,
    *,
    kind: str,
    actor_type: str,
    actor: str,
    fields: dict[str, Any] | None = None,
    **detail: Any,
) -> Task:
    if not is_allowed(task.status, to):
        raise InvalidTransition(task, to)
    old = task.status
    task.status = to
    update = ["status", "updated_at"]
    for name, value in (fields or {}).items():
        setattr(task, name, value)
        update.append(name)
    if to in TERMINAL_STATUSES:
        task.finished_at = timezone.now()
        task.lease_owner, task.lease_expires_at = "", None
        update += ["finished_at", "lease_owner", "lease_expires_at"]
    task.save(update_fields=update)
    event(task, kind, actor_type=actor_type, actor=actor, old_status=old, new_status=to, **detail)
    if to in TERMINAL_STATUSES:
        _close_pending_requests(task, reason=to)
    return task


def _end_leased(
    task_id: str,
    to: str,
    *,
    lease_owner: str,
    kind: str,
    actor: str,
    fields: dict[str, Any],
    **detail: Any,
) -> Task:
    """``_move`` to a terminal status for the leg that holds the task's lease: a leased task is
    working, so a compare-and-set UPDATE on (working, lease owner) replaces the locking read
    on this hot path (on PostgreSQL, one statement that also writes the event and closes
    pending questions). Raise LeaseLost if another leg holds the task now. Return a partial
    instance (the fields written)."""
    assert to in TERMINAL_STATUSES and is_allowed(Status.WORKING, to)
    now = timezone.now()
    if connection.vendor == "postgresql":
        ended = _end_leased_postgresql(task_id=task_id, to=to, owner=lease_owner, kind=kind,
                                        actor=actor, fields=fields, detail=detail, now=now)  # fmt: skip
        if not ended:
            raise LeaseLost(f"task {task_id} is no longer leased by {lease_owner}")
        return Task(pk=task_id, status=to, finished_at=now, **fields)
    with transaction.atomic():
        leased = Task.objects.filter(pk=task_id, status=Status.WORKING, lease_owner=lease_owner)
        changed = leased.update(status=to, updated_at=now, finished_at=now, lease_owner="",
                                lease_expires_at=None, **fields)  # fmt: skip
        if not changed:
            raise LeaseLost(f"task {task_id} is no longer leased by {lease_owner}")
        task = Task(pk=task_id, status=to, finished_at=now, **fields)
        event(task, kind, actor_type=Actor.WORKER, actor=actor, old_status=Status.WORKING,
              new_status=to, **detail)  # fmt: skip
        _close_pending_requests(task, reason=to)
    return task


# --- a leg ending its task ----------------------------------------------------------------

_END_LEASED = """
WITH ended AS (
    UPDATE {task} SET status = %(to)s, updated_at = %(now)s, finished_at = %(now)s,
        lease_owner = '', lease_expires_at = NULL{assignments}
    WHERE id = %(task_id)s AND status = %(working)s AND lease_owner = %(owner)s
    RETURNING id
), closed AS (
    UPDATE {request} SET status = %(cancelled)s
    WHERE task_id IN (SELECT id FROM ended) AND status = %(pending)s
    RETURNING key
), written AS (
    INSERT INTO {event}
        (task_id, kind, actor_type, actor, old_status, new_status, detail, created_at)
    SELECT task_id, kind, actor_type, actor, old_status, new_status, detail, %(now)s
    FROM (
        SELECT 1 AS n, id AS task_id, %(kind)s AS kind, %(worker)s AS actor_type,
            %(actor)s AS actor, %(working)s AS old_status, %(to)s AS new_status,
            %(detail)s::jsonb AS detail
        FROM ended
        UNION ALL
        SELECT 2, %(task_id)s, 'input_closed', %(system)s, '', '', '',
            jsonb_build_object('keys', (SELECT jsonb_agg(key ORDER BY key) FROM closed),
                               'reason', %(to)s)
        WHERE EXISTS (SELECT 1 FROM closed)
    ) AS rows
    ORDER BY n
)
SELECT count(*) FROM ended
"""


@cache
def _end_leased_sql(names: tuple[str, ...]) -> str:
    from elicitations.models import InputRequest

    q = connections[DEFAULT_DB_ALIAS].ops.quote_name
    return _END_LEASED.format(
        task=q(Task._meta.db_table),
        request=q(InputRequest._meta.db_table),
        event=q(TaskEvent._meta.db_table),
        assignments="".join(f", {q(name)} = %({name})s" for name in names),
    )


def _end_leased_postgresql(
    *,
    task_id: str,
    to: str,
    owner: str,
    kind: str,
    actor: str,
    fields: dict[str, Any],
    detail: dict[str, Any],
    now: Any,
) -> bool:
    """PostgreSQL only: end leased task TASK_ID in status TO in one statement (so in one
    round trip, and atomic without a transaction block): set FIELDS, clear the lease, write
    the KIND event, close pending input requests and record that. Return False, having
    written nothing, if OWNER no longer holds the lease of a working task."""
    from elicitations.models import RequestStatus

    db = connections[DEFAULT_DB_ALIAS]
    params: dict[str, Any] = {
        name: Task._meta.get_field(name).get_db_prep_save(value, connection=db)
        for name, value in fields.items()
    }
    params.update(
        task_id=task_id,
        to=to,
        owner=owner,
        kind=kind,
        actor=actor,
        detail=Jsonb(detail),
        now=now,
        working=Status.WORKING.value,
        cancelled=RequestStatus.CANCELLED.value,
        pending=RequestStatus.PENDING.value,
        worker=Actor.WORKER.value,
        system=Actor.SYSTEM.value,
    )
    row = rows.fetch_prepared(_end_leased_sql(tuple(sorted(fields))), params)
    return bool(row and row[0])


@transaction.atomic
def _end_locked(
    task_id: str,
    to: str,
    *,
    kind: str,
    actor_type: str,
    actor: str,
    fields: dict[str, Any],
    **detail: Any,
) -> Task:
    task = _locked(task_id)
    return _move(task, to, kind=kind, actor_type=actor_type, actor=actor, fields=fields, **detail)


def _close_pending_requests(task: Task, *, reason: str) -> None:
    # Imported here: elicitations builds on tasks_app, not the other way round.
    from elicitations.models import RequestStatus

    closed = list(
        task.input_requests.filter(status=RequestStatus.PENDING)
        .order_by("key")
        .values_list("key", flat=True)
    )
    if closed:
        task.input_requests.filter(key__in=closed).update(status=RequestStatus.CANCELLED)
        event(task, "input_closed", actor_type=Actor.SYSTEM, keys=closed, reason=reason)


@transaction.atomic
def require_input(*, task_id: str, message: str = "", actor: str = "") -> Task:
    """Move a working task to INPUT_REQUIRED (the client has a question to answer)."""
    task = _locked(task_id)
    return _move(
        task,
        Status.INPUT_REQUIRED,
        kind="input_required",
        actor_type=Actor.WORKER,
        actor=actor,
        fields={"status_message": message},
    )


@transaction.atomic
def resume(*, task_id: str, actor_type: str, actor: str = "", reason: str = "answered") -> Task:
    """Dispatch a new leg of a task whose questions were answered.

    An INPUT_REQUIRED task moves back to WORKING; a WORKING task (waiting on an operator)
    keeps its status. Raise InvalidTransition for a terminal task.
    """
    task = _locked(task_id)
    if task.status == Status.INPUT_REQUIRED:
        _move(
            task,
            Status.WORKING,
            kind="resumed",
            actor_type=actor_type,
            actor=actor,
            fields={"status_message": ""},
            reason=reason,
        )
    elif task.status == Status.WORKING:
        event(task, "resumed", actor_type=actor_type, actor=actor, reason=reason)
    else:
        raise InvalidTransition(task, Status.WORKING)
    dispatch.enqueue(task, reason=reason)
    return task


def complete(
    *, task_id: str, result: dict[str, Any], actor: str = "", lease_owner: str | None = None
) -> Task:
    """Move a task to COMPLETED with RESULT (a CallToolResult; isError marks tool errors).

    A leg passes its LEASE_OWNER: LeaseLost is raised if another leg holds the task now.
    """
    fields = {"result": result, "status_message": ""}
    is_error = bool(result.get("isError"))
    if lease_owner is not None:
        return _end_leased(task_id, Status.COMPLETED, lease_owner=lease_owner, kind="completed",
                           actor=actor, fields=fields, is_error=is_error)  # fmt: skip
    return _end_locked(task_id, Status.COMPLETED, kind="completed", actor_type=Actor.WORKER,
                       actor=actor, fields=fields, is_error=is_error)  # fmt: skip


def fail(
    *,
    task_id: str,
    error: dict[str, Any],
    actor_type: str = Actor.WORKER,
    actor: str = "",
    lease_owner: str | None = None,
) -> Task:
    """Move a task to FAILED with a JSON-RPC error object (LEASE_OWNER: as in ``complete``)."""
    fields = {"error": error, "status_message": str(error.get("message", ""))[:2000]}
    if lease_owner is not None:
        return _end_leased(task_id, Status.FAILED, lease_owner=lease_owner, kind="failed",
                           actor=actor, fields=fields, code=error.get("code"))  # fmt: skip
    return _end_locked(task_id, Status.FAILED, kind="failed", actor_type=actor_type,
                       actor=actor, fields=fields, code=error.get("code"))  # fmt: skip


@transaction.atomic
def request_cancel(*, task_id: str, actor_type: str, actor: str = "") -> Task:
    """Record a cancellation request. A task waiting for input is cancelled at once.

    A working task keeps running until its leg reaches the next checkpoint (the runtime then
    calls ``cancel``). A terminal task is left as it is; the request is still recorded.
    """
    task = _locked(task_id)
    now = timezone.now()
    first = task.cancel_requested_at is None
    if first and not task.is_terminal:
        task.cancel_requested_at = now
        task.save(update_fields=["cancel_requested_at", "updated_at"])
    event(
        task,
        "cancel_requested",
        actor_type=actor_type,
        actor=actor,
        status=task.status,
        first=first,
    )
    if task.status == Status.INPUT_REQUIRED or (
        task.status == Status.WORKING and not task.lease_owner and first
    ):
        # Nothing is running (suspended for input, or not yet picked up): stop right away.
        # Effects that already happened and can be undone are undone afterwards, by a leg
        # that replays the journal to find their compensate hooks.
        undo = task.effects.filter(state=EffectState.CONFIRMED, compensable=True).exists()
        _move(
            task,
            Status.CANCELLED,
            kind="cancelled",
            actor_type=actor_type,
            actor=actor,
            work_stopped=True,
            compensating=undo,
        )
        if undo:
            dispatch.enqueue(task, reason=dispatch.COMPENSATE)
    return task


def cancel(*, task_id: str, actor: str = "", lease_owner: str | None = None) -> Task:
    """Move a task whose cancellation was requested to CANCELLED once its work has stopped
    (LEASE_OWNER: as in ``complete``)."""
    if lease_owner is not None:
        return _end_leased(task_id, Status.CANCELLED, lease_owner=lease_owner, kind="cancelled",
                           actor=actor, fields={}, work_stopped=True)  # fmt: skip
    return _end_locked(task_id, Status.CANCELLED, kind="cancelled", actor_type=Actor.WORKER,
                       actor=actor, fields={}, work_stopped=True)  # fmt: skip


@transaction.atomic
def set_status_message(*, task_id: str, message: str) -> None:
    """Update the human-readable status line of a non-terminal task (no status change)."""
    Task.objects.filter(pk=task_id, status__in=[Status.WORKING, Status.INPUT_REQUIRED]).update(
        status_message=message[:2000], updated_at=timezone.now()
    )
