"""The only code that changes ``Task.status``.

(The single-statement end of a leased task is SQL in ``tasks_app.db``; only this module runs
it.) A task that ends closes its pending questions through ``tasks_app.seams``, in the same
transaction or statement.

Each function locks the row (``select_for_update``; on SQLite the IMMEDIATE transaction
serializes writers instead), checks the allowed-transition table, saves with
``update_fields``, writes a ``TaskEvent`` (and, for the events a webhook of the task's client
subscribes to, its ``tasks_app.outbox`` messages) in the same transaction and schedules
follow-up work on commit. The MCP handlers, the inbox, the dashboard, the admin and the Celery jobs all
call these functions.

Lock order: a Task row is always locked before any of its InputRequest or Effect rows.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from django.db import transaction
from django.utils import timezone

from tasks_app import db, dispatch, metrics, outbox, seams, storage
from tasks_app.models import (
    TERMINAL_STATUSES,
    Actor,
    EffectState,
    EventKind,
    Status,
    Task,
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


class LeaseLost(BaseException):
    """A leg tried to change a task whose lease another leg holds now (it was presumed dead).

    The runtime raises it too, to unwind a leg that lost its lease: like the runtime's other
    leg interrupts it derives from ``BaseException``, so that a tool's ``except Exception:``
    cannot swallow it.
    """


def is_allowed(old: str, new: str) -> bool:
    return new in ALLOWED.get(old, set())


def _locked(task_id: str) -> Task:
    return Task.objects.select_for_update().get(pk=task_id)


def _move(
    task: Task,
    to: str,
    *,
    kind: EventKind,
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
    now = timezone.now()
    if to in TERMINAL_STATUSES:
        task.finished_at = now
        task.stored_bytes += storage.ended_bytes(fields or {})
        update += ["finished_at", "stored_bytes"]
    task.save(update_fields=update)
    event(task, kind, actor_type=actor_type, actor=actor, old_status=old, new_status=to, **detail)
    outbox.write_for_task(task, kind, now=now)  # the client's webhooks, in this transaction
    if to in TERMINAL_STATUSES:
        if task.lease_owner:  # a terminal task holds no lease (a leg still running loses it)
            db.backend().release(task_id=task.pk, owner=None, now=now)
            task.lease_owner, task.lease_expires_at = "", None
        seams.pending_questions().close(task, reason=to)
        # Counted once the transaction commits: a rolled-back end did not happen.
        ended = partial(metrics.task_ended, tool=task.tool_name, status=to, now=now)
        transaction.on_commit(partial(ended, created_at=task.created_at))
    return task


def _end_leased(
    task_id: str,
    to: Status,
    *,
    lease_owner: str,
    lease_leg: int,
    kind: EventKind,
    actor: str,
    fields: dict[str, Any],
    **detail: Any,
) -> Task:
    """``_move`` to a terminal status for the leg that holds the task's lease: a leased task is
    working, so a compare-and-set on (working, the lease's fence) replaces the locking read on
    this hot path (``tasks_app.db``: on PostgreSQL one statement that also writes the event and closes
    pending questions). Raise LeaseLost, having written nothing, if the lease of LEASE_OWNER
    and generation LEASE_LEG was taken over or expired by the database's clock. Return a
    partial instance (the fields written)."""
    assert to in TERMINAL_STATUSES and is_allowed(Status.WORKING, to)
    now = timezone.now()
    ending = db.Ending(task_id=task_id, status=to, kind=kind, owner=lease_owner, leg=lease_leg,
                       actor=actor, fields=fields, detail=detail, now=now,
                       grow=storage.ended_bytes(fields))  # fmt: skip
    ended = db.backend().end_leased(ending)
    if ended is None:
        raise LeaseLost(f"task {task_id} is no longer leased by {lease_owner} (leg {lease_leg})")
    metrics.task_ended(tool=ended.tool_name, status=to, created_at=ended.created_at, now=now)
    return Task(id=task_id, status=to, finished_at=now, **fields)


@transaction.atomic
def _end_locked(
    task_id: str,
    to: Status,
    *,
    kind: EventKind,
    actor_type: str,
    actor: str,
    fields: dict[str, Any],
    **detail: Any,
) -> Task:
    task = _locked(task_id)
    return _move(task, to, kind=kind, actor_type=actor_type, actor=actor, fields=fields, **detail)


@transaction.atomic
def require_input(*, task_id: str, message: str = "", actor: str = "") -> Task:
    """Move a working task to INPUT_REQUIRED (the client has a question to answer)."""
    task = _locked(task_id)
    return _move(
        task,
        Status.INPUT_REQUIRED,
        kind=EventKind.INPUT_REQUIRED,
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
            kind=EventKind.RESUMED,
            actor_type=actor_type,
            actor=actor,
            fields={"status_message": ""},
            reason=reason,
        )
    elif task.status == Status.WORKING:
        event(task, EventKind.RESUMED, actor_type=actor_type, actor=actor, reason=reason)
    else:
        raise InvalidTransition(task, Status.WORKING)
    dispatch.enqueue(task, reason=reason)
    return task


def _end(
    task_id: str,
    to: Status,
    *,
    lease_owner: str | None,
    lease_leg: int | None = None,
    actor_type: str = Actor.WORKER,
    actor: str,
    fields: dict[str, Any],
    **detail: Any,
) -> Task:
    """End TASK_ID in terminal status TO, recorded by an event of the same name: as the leg
    holding LEASE_OWNER's lease of generation LEASE_LEG (``_end_leased``), or under the task
    lock (``_end_locked``)."""
    kind = EventKind(to.value)
    if lease_owner is not None:
        assert lease_leg is not None, "a leg ends a task with its fencing token"
        return _end_leased(task_id, to, lease_owner=lease_owner, lease_leg=lease_leg, kind=kind,
                           actor=actor, fields=fields, **detail)  # fmt: skip
    return _end_locked(task_id, to, kind=kind, actor_type=actor_type, actor=actor, fields=fields,
                       **detail)  # fmt: skip


def complete(
    *,
    task_id: str,
    result: dict[str, Any],
    actor: str = "",
    lease_owner: str | None = None,
    lease_leg: int | None = None,
) -> Task:
    """Move a task to COMPLETED with RESULT (a CallToolResult; isError marks tool errors).

    A leg passes its LEASE_OWNER and LEASE_LEG (its fencing token): LeaseLost is raised if
    that lease was taken over or has expired.
    """
    is_error = bool(result.get("isError"))
    # is_error is written with the result, on both ways of ending (the ORM's save and the
    # hot path's statement write every field given here).
    fields = {"result": result, "status_message": "", "is_error": is_error}
    return _end(task_id, Status.COMPLETED, lease_owner=lease_owner, lease_leg=lease_leg,
                actor=actor, fields=fields, is_error=is_error)  # fmt: skip


def fail(
    *,
    task_id: str,
    error: dict[str, Any],
    actor_type: str = Actor.WORKER,
    actor: str = "",
    lease_owner: str | None = None,
    lease_leg: int | None = None,
) -> Task:
    """Move a task to FAILED with a JSON-RPC error object (LEASE_OWNER, LEASE_LEG: as in
    ``complete``)."""
    fields = {"error": error, "status_message": str(error.get("message", ""))[:2000]}
    return _end(task_id, Status.FAILED, lease_owner=lease_owner, lease_leg=lease_leg,
                actor_type=actor_type, actor=actor, fields=fields,
                code=error.get("code"))  # fmt: skip


@transaction.atomic
def request_cancel(*, task_id: str, actor_type: str, actor: str = "", **detail: Any) -> Task:
    """Record a cancellation request. A task waiting for input is cancelled at once.

    A working task keeps running until its leg reaches the next checkpoint (the runtime then
    calls ``cancel``). A terminal task is left as it is; the request is still recorded.
    DETAIL goes into the timeline's entry (a bulk action names itself there).
    """
    task = _locked(task_id)
    now = timezone.now()
    first = task.cancel_requested_at is None
    if first and not task.is_terminal:
        task.cancel_requested_at = now
        task.save(update_fields=["cancel_requested_at", "updated_at"])
    event(
        task,
        EventKind.CANCEL_REQUESTED,
        actor_type=actor_type,
        actor=actor,
        status=task.status,
        first=first,
        **detail,
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
            kind=EventKind.CANCELLED,
            actor_type=actor_type,
            actor=actor,
            work_stopped=True,
            compensating=undo,
        )
        if undo:
            dispatch.enqueue(task, reason=dispatch.COMPENSATE)
    return task


def cancel(
    *,
    task_id: str,
    actor: str = "",
    lease_owner: str | None = None,
    lease_leg: int | None = None,
) -> Task:
    """Move a task whose cancellation was requested to CANCELLED once its work has stopped
    (LEASE_OWNER, LEASE_LEG: as in ``complete``)."""
    return _end(task_id, Status.CANCELLED, lease_owner=lease_owner, lease_leg=lease_leg,
                actor=actor, fields={}, work_stopped=True)  # fmt: skip


@transaction.atomic
def set_status_message(*, task_id: str, message: str) -> None:
    """Update the human-readable status line of a non-terminal task (no status change)."""
    Task.objects.filter(pk=task_id, status__in=[Status.WORKING, Status.INPUT_REQUIRED]).update(
        status_message=message[:2000], updated_at=timezone.now()
    )
