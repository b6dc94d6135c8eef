"""One leg of a task: claim the lease, run the tool function from the top, record the end.

How a leg ends:

- the function returns: ``completed`` with its result;
- ``ToolError`` or any other exception: ``completed`` with ``isError: true`` and the message
  (for an unexpected exception, only a reference; its text and traceback go to the worker
  log under that reference);
- ``ProtocolError``: ``failed`` with that JSON-RPC error;
- ``Cancelled`` at a checkpoint: ``cancelled`` (the work has stopped);
- a question without an answer, or an effect an operator must reconcile: the leg ends and
  the task waits (both already recorded by the context);
- a different journaled call than the journal recorded, or the tool's time limit: ``failed``
  with an error that says so.

``_end`` records the ending by calling ``transitions.complete``, ``fail`` or ``cancel`` with
this leg's lease owner: the transition checks that the leg still holds the lease, so a leg
presumed dead (and replaced) never ends a task.
"""

from __future__ import annotations

import enum
import logging
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connection, transaction

from tasks_app import db, logcontext, metrics, storage, tracing, transitions
from tasks_app.models import Actor, EventKind, Status, Task, event
from tasks_app.runtime import leases
from tasks_app.runtime.context import TaskContext
from tasks_app.runtime.effects import compensate_all
from tasks_app.runtime.errors import (
    AwaitingReconciliation,
    LeaseLost,
    LegAborted,
    NotDeterministic,
    RetryScheduled,
    Suspended,
    TimeLimitExceeded,
)
from tasks_app.tools import (
    Cancelled,
    ProtocolError,
    ToolError,
    ToolSpec,
    enabled_tools,
    get_tool,
    results,
)

log = logging.getLogger("tasks_app.runtime")

INTERNAL_ERROR = -32603


class LegOutcome(enum.StrEnum):
    SKIPPED = "skipped"  # duplicate message, task not working, or another live leg
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    SUSPENDED = "suspended"  # waiting for answers
    RETRYING = "retrying"  # a step failed; its next attempt's leg is scheduled
    AWAITING_OPERATOR = "awaiting_operator"  # an unknown effect needs reconciling
    LEASE_LOST = "lease_lost"  # replaced by another leg; wrote nothing more
    ABORTED = "aborted"  # the runtime's bookkeeping failed; the sweeper re-runs it
    UNDONE = "undone"  # a task cancelled while nothing ran: its effects were undone


def run_leg(*, task_id: str, dispatch_id: int | None = None) -> LegOutcome:
    """Run one leg of task TASK_ID (dispatch record DISPATCH_ID) and return how it ended."""
    owner = leases.new_owner()
    sent = time.monotonic()
    claim = leases.claim(task_id=task_id, dispatch_id=dispatch_id, owner=owner)
    if claim is None:
        # A duplicate message, or one whose record a waiting leg consumed first: routine.
        log.debug("leg skipped task=%s dispatch=%s", task_id, dispatch_id)
        return LegOutcome.SKIPPED
    return run_claimed(claim, owner, dispatch_id, sent)


def run_claimed(
    claim: db.Claim, owner: str, dispatch_id: int | None, sent: float, *, drained: bool = False
) -> LegOutcome:
    """Run the leg CLAIM took (its claim was sent at monotonic time SENT; DRAINED: by this
    process as a drainer, ``runtime.draining``)."""
    # Every line of the leg (the tool's ctx.log lines too) names the task, and the request
    # that wrote the dispatch record (for a first leg, the call that created the task).
    task = claim.task
    with (
        logcontext.bound(
            task_id=task.pk,
            tool=task.tool_name,
            leg=task.leg,
            request_id=claim.origin.get("request_id"),
            client=claim.origin.get("client"),
        ),
        tracing.continued(
            claim.origin,
            f"execute_tool {task.tool_name}",
            conventional={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": task.tool_name,
                "gen_ai.tool.call.id": str(task.pk),
            },
            task_id=task.pk,
            tool=task.tool_name,
            leg=task.leg,
        ),
    ):
        return _run_logged(claim, owner, dispatch_id, sent, drained)


def _run_logged(
    claim: db.Claim, owner: str, dispatch_id: int | None, sent: float, drained: bool
) -> LegOutcome:
    task = claim.task
    started = time.monotonic()
    # At INFO a leg logs one line, when it ends (with its outcome and duration).
    log.debug(
        "leg started task=%s leg=%s tool=%s dispatch=%s owner=%s",
        task.pk,
        task.leg,
        task.tool_name,
        dispatch_id,
        owner,
    )
    spec = get_tool(task.tool_name)
    if spec is None and task.status == Status.CANCELLED:
        log.error("undo leg task=%s: tool %s is not enabled here", task.pk, task.tool_name)
        outcome = _end_undo(task.pk, owner, leg=task.leg, error="tool not available")
    elif spec is None:
        error = {
            "code": INTERNAL_ERROR,
            "message": f"Tool {task.tool_name} is not available on this worker "
            "(its toolset is not in TASKDESK_TOOLSETS)",
        }
        outcome = _end(task.pk, owner, task.leg, Ending(LegOutcome.FAILED, error=error))
    else:
        ctx = TaskContext(
            task=task,
            spec=spec,
            owner=owner,
            has_journal=claim.has_journal,
            cancel_checked=not claim.cancel_requested,
        )
        with leases.held(task.pk, owner, task.leg, since=sent, drained=drained) as lease:
            ctx.lease = lease
            outcome = _undo(ctx) if task.status == Status.CANCELLED else _run(ctx)
    seconds = time.monotonic() - started
    metrics.leg_ended(tool=task.tool_name, seconds=seconds)
    # A completed leg at DEBUG unless TASKDESK_LOG_EVERY_TASK (see config/settings.py).
    quiet = outcome == LegOutcome.COMPLETED and not settings.TASKDESK_LOG_EVERY_TASK
    log.log(
        logging.DEBUG if quiet else logging.INFO,
        "leg ended task=%s leg=%s outcome=%s ms=%.0f",
        task.pk,
        task.leg,
        outcome,
        seconds * 1000,
    )
    return outcome


def _run(ctx: TaskContext) -> LegOutcome:
    try:
        ending = _call(ctx)
        if ending.compensate:
            compensate_all(ctx, reason=ending.outcome)
        return _end(ctx.task_id, ctx.owner, ctx.leg, ending)
    except Suspended:
        return LegOutcome.SUSPENDED
    except RetryScheduled:
        return LegOutcome.RETRYING
    except AwaitingReconciliation:
        return LegOutcome.AWAITING_OPERATOR
    except LeaseLost as exc:
        log.warning("leg stopped task=%s leg=%s: %s", ctx.task_id, ctx.leg, exc)
        return LegOutcome.LEASE_LOST
    except LegAborted as exc:
        log.error("leg aborted task=%s leg=%s: %s", ctx.task_id, ctx.leg, exc)
        return LegOutcome.ABORTED


def _undo(ctx: TaskContext) -> LegOutcome:
    """The leg of a task cancelled while nothing ran (``transitions.request_cancel``): replay
    the journal, which runs no effect again but registers the compensate hooks, up to the
    checkpoint after the last recorded effect, where the cancellation stops the function;
    then undo the confirmed effects, newest first. The task stays ``cancelled``."""
    error = ""
    try:
        ending = _call(ctx)
        if ending.outcome == LegOutcome.CANCELLED:
            compensate_all(ctx, reason=Status.CANCELLED)
        else:
            error = f"the replay ended {ending.outcome} before reaching the cancellation"
    except (Suspended, AwaitingReconciliation, RetryScheduled) as exc:
        error = f"the replay stopped at {type(exc).__name__}"
    except LeaseLost as exc:
        log.warning("undo leg stopped task=%s leg=%s: %s", ctx.task_id, ctx.leg, exc)
        return LegOutcome.LEASE_LOST
    except LegAborted as exc:  # the lease runs out and the sweeper dispatches a new leg
        log.error("undo leg aborted task=%s leg=%s: %s", ctx.task_id, ctx.leg, exc)
        return LegOutcome.ABORTED
    if error:
        log.warning("undo leg task=%s leg=%s: %s; nothing undone", ctx.task_id, ctx.leg, error)
    return _end_undo(ctx.task_id, ctx.owner, leg=ctx.leg, error=error)


def _end_undo(task_id: str, owner: str, *, leg: int, error: str) -> LegOutcome:
    with transaction.atomic():
        if leases.lock(task_id, owner, leg) is None or not leases.release(task_id, owner, leg):
            log.warning("undo leg task=%s leg=%s lost its lease: writes refused", task_id, leg)
            return LegOutcome.LEASE_LOST
        detail: dict[str, Any] = {"leg": leg} | ({"error": error} if error else {})
        event(
            Task(id=task_id),
            EventKind.UNDO_FINISHED,
            actor_type=Actor.WORKER,
            actor=owner,
            **detail,
        )
    return LegOutcome.UNDONE


@dataclass(frozen=True)
class Ending:
    """How the tool function ended: the outcome, what to record, whether to undo effects."""

    outcome: LegOutcome
    result: dict[str, Any] | None = None  # COMPLETED: the CallToolResult
    error: dict[str, Any] | None = None  # FAILED: the JSON-RPC error object
    compensate: bool = False


def _call(ctx: TaskContext) -> Ending:
    spec, task_id = ctx.spec, ctx.task_id
    try:
        with _time_limit(ctx):
            value = spec.invoke(ctx, ctx.task.arguments)
        ctx.check_journal_consumed()
    except NotDeterministic as exc:
        log.error("not deterministic task=%s leg=%s: %s", task_id, ctx.leg, exc.message)
        error = {"code": INTERNAL_ERROR, "message": exc.message, "data": exc.data}
        return Ending(LegOutcome.FAILED, error=error)
    except TimeLimitExceeded as exc:
        message = (
            f"Tool {spec.name} ran longer than its time limit of {exc.seconds:g} s "
            f"(leg {ctx.leg}) and was stopped"
        )
        log.warning("time limit task=%s leg=%s limit=%s", task_id, ctx.leg, exc.seconds)
        data = {"reason": "time_limit", "timeLimitSeconds": exc.seconds}
        error = {"code": INTERNAL_ERROR, "message": message, "data": data}
        return Ending(LegOutcome.FAILED, error=error, compensate=True)
    except Cancelled:
        return Ending(LegOutcome.CANCELLED, compensate=True)
    except ProtocolError as exc:
        error = {"code": exc.code, "message": str(exc)}
        if exc.data is not None:
            error["data"] = exc.data
        return Ending(LegOutcome.FAILED, error=error, compensate=True)
    except ToolError as exc:
        log.info("tool error task=%s leg=%s: %s", task_id, ctx.leg, exc)
        return _completed(results.error_result(str(exc)))
    except Exception:
        reference = results.new_reference()
        log.exception("tool raised task=%s leg=%s reference=%s", task_id, ctx.leg, reference)
        return _completed(results.unexpected_error_result(reference))
    return _completed(results.for_tool(spec.name, spec.output_schema, value))


def _completed(result: dict[str, Any]) -> Ending:
    size = storage.json_bytes(result)
    limit = settings.TASKDESK_MAX_RESULT_BYTES
    if size > limit:
        # Not kept: the task fails, naming the limit, and its effects are undone as for any
        # failure (a result nobody can be given is no outcome).
        message = (
            f"The result is {size} bytes of JSON; a task keeps at most {limit} "
            "(TASKDESK_MAX_RESULT_BYTES): return a reference to large data instead"
        )
        data = {"reason": "result_too_large", "bytes": size, "limit": limit}
        error = {"code": INTERNAL_ERROR, "message": message, "data": data}
        return Ending(LegOutcome.FAILED, error=error, compensate=True)
    # A tool error (isError) undoes the task's effects, as a failure does.
    return Ending(LegOutcome.COMPLETED, result=result, compensate=bool(result.get("isError")))


def _end(task_id: str, owner: str, leg: int, ending: Ending) -> LegOutcome:
    """Record ENDING through the transition of its outcome, as the leg holding OWNER's lease
    of generation LEG. Return LEASE_LOST if that lease was taken over or has expired (this
    leg was presumed dead): its result is dropped."""
    try:
        if ending.outcome == LegOutcome.COMPLETED:
            assert ending.result is not None
            transitions.complete(task_id=task_id, result=ending.result, actor=owner,
                                 lease_owner=owner, lease_leg=leg)  # fmt: skip
        elif ending.outcome == LegOutcome.FAILED:
            assert ending.error is not None
            transitions.fail(task_id=task_id, error=ending.error, actor=owner, lease_owner=owner,
                             lease_leg=leg)  # fmt: skip
        elif ending.outcome == LegOutcome.CANCELLED:
            transitions.cancel(task_id=task_id, actor=owner, lease_owner=owner, lease_leg=leg)
        else:
            raise ValueError(f"a leg cannot end the task as {ending.outcome}")
    except LeaseLost as exc:
        log.warning("leg result dropped task=%s: %s", task_id, exc)
        return LegOutcome.LEASE_LOST
    return ending.outcome


def leg_time_limit(spec: ToolSpec) -> float:
    """How long one leg of SPEC may run: its own ``time_limit``, or
    ``TASKDESK_LEG_TIME_LIMIT_SECONDS`` for a tool that sets none."""
    return float(spec.time_limit or settings.TASKDESK_LEG_TIME_LIMIT_SECONDS)


def job_time_limit() -> float:
    """Celery's hard time limit of one ``run_task_job``: the backstop for a leg that ignores
    its own time limit (stuck in code that no alarm interrupts). A job runs its leg and then
    may start waiting legs for ``TASKDESK_WAITING_LEGS_SECONDS``, so it allows the longest
    leg time limit of the enabled tools twice, that, and a minute for the bookkeeping."""
    default = float(settings.TASKDESK_LEG_TIME_LIMIT_SECONDS)
    longest = max([leg_time_limit(spec) for spec in enabled_tools().values()] or [default])
    return 2 * longest + float(settings.TASKDESK_WAITING_LEGS_SECONDS) + 60


@contextmanager
def _time_limit(ctx: TaskContext) -> Iterator[None]:
    """Enforce the leg's time limit (``leg_time_limit``: the tool's, or the default).

    Two mechanisms, because Celery's own soft time limit is fixed per job type and a single
    ``run_task_job`` serves every tool: each checkpoint compares the clock with the deadline,
    and, in a prefork pool process (where the job runs on the main thread), a SIGALRM timer
    raises TimeLimitExceeded inside code that never reaches a checkpoint (a blocking call).
    The alarm waits while the runtime itself writes to the database (``ctx.shielded``), so
    it never cuts the runtime's bookkeeping in half.
    """
    limit = leg_time_limit(ctx.spec)
    ctx.time_limit = limit
    ctx.deadline = time.monotonic() + limit
    alarm = threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")
    previous: Any = None
    if alarm:
        previous = signal.signal(signal.SIGALRM, lambda signum, frame: ctx.on_alarm())
        signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        yield
    finally:
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        ctx.deadline = None
        ctx.time_limit = None
        if not connection.in_atomic_block:
            # The alarm may have interrupted a query of the tool's own: drop a connection
            # left unusable rather than fail the task's last transition on it.
            close_old_connections()
