"""The effects ledger: what a task did to the outside world, and whether it really happened.

``with ctx.effect(name, ...) as fx`` commits an ``intended`` Effect row (and its journal
entry) before the body runs, and ``confirmed`` or ``failed`` after it. A leg that finds an
effect still ``intended`` knows the leg that ran it died in between: the effect becomes
``unknown`` and the tool's ``verify`` hook decides (happened: ``confirmed``, the body is
skipped; did not happen: the body runs again with the same downstream key). Without a hook,
or when the hook itself fails, the task waits for an operator (``reconcile_effect``); the
runtime never guesses. Every state change writes a TaskEvent.

Lock order: the Task row first, then its Effect rows (as everywhere else).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any, Literal, NoReturn, Protocol

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from tasks_app import outbox, tracing, transitions
from tasks_app.models import (
    TERMINAL_STATUSES,
    Actor,
    Effect,
    EffectState,
    EventKind,
    JournalEntry,
    JournalKind,
    Status,
    Task,
    event,
)
from tasks_app.runtime import leases
from tasks_app.runtime.errors import (
    AwaitingReconciliation,
    LeaseLost,
    LegInterrupt,
    TimeLimitExceeded,
)
from tasks_app.runtime.retries import ATTEMPTS, RETRY_AT
from tasks_app.tools import Cancelled, EffectFailed, EffectHandle, Retry


class Leg(Protocol):
    """What the ledger needs of the leg it records for (``context.TaskContext`` is one)."""

    task_id: str
    leg: int
    owner: str
    effect_in_flight: EffectScope | None
    compensations: list[Compensation]

    def shielded(self) -> AbstractContextManager[None]: ...

    def owned_task(self) -> Task: ...

    def suspend_for_retry(
        self,
        *,
        name: str,
        attempts: list[dict[str, Any]],
        retry: Retry,
        record: Callable[[str], None],
    ) -> NoReturn: ...

    def checkpoint(self, *, fresh: bool = False) -> None: ...

    def forbid_in_effect(self, call: str) -> None: ...

    def next_entry(self, kind: str, name: str) -> JournalEntry | None: ...

    def new_seq(self) -> int: ...

    def append(self, entry: JournalEntry) -> None: ...


log = logging.getLogger("tasks_app.runtime")


def downstream_key(task_id: str, name: str, seq: int) -> str:
    """The idempotency key an effect passes to the outside world: stable across legs."""
    return f"{task_id}:{name}:{seq}"


@dataclass
class Compensation:
    effect_id: int
    name: str
    key: str
    hook: Callable[[str], None]


# In the detail of an effect a run again took over from the task it runs again (tasks_app.rerun):
# that task's id, the effect's seq there, and its downstream key, which the effect keeps.
REUSED = "reused"


def key_of(row: Effect) -> str:
    """The downstream key of ROW's effect: its own, or, for an effect a run again took over,
    the one it happened with (so verify and compensate hooks ask about the real one)."""
    reused = row.detail.get(REUSED)
    return (
        str(reused["key"]) if isinstance(reused, dict) and reused.get("key") else row.downstream_key
    )


class EffectScope(EffectHandle):
    """The context manager ``ctx.effect`` returns; it is also the ``fx`` handle."""

    def __init__(
        self,
        ctx: Leg,
        name: str,
        *,
        target: str,
        verify: Callable[[str], bool] | None,
        compensate: Callable[[str], None] | None,
        retry: Retry | None = None,
    ) -> None:
        self.ctx = ctx
        self.name = name
        self.target = target
        self.verify = verify
        self.compensate = compensate
        self.retry = retry
        self.entry: JournalEntry | None = None
        self.key = ""
        self.done = False
        self.detail: dict[str, Any] = {}
        self.row: Effect | None = None
        self._recorded: dict[str, Any] = {}
        self._span: AbstractContextManager[Any] = tracing.OFF

    # --- entering: intent, or what an earlier leg recorded ---------------------------------

    def __enter__(self) -> EffectScope:
        ctx = self.ctx
        # Read the flag now, not from the throttled cache: no effect starts once
        # cancellation is recorded. The intent transaction checks it again under the lock.
        ctx.checkpoint(fresh=True)
        ctx.forbid_in_effect("ctx.effect")
        entry = ctx.next_entry(JournalKind.EFFECT, self.name)
        if entry is None:
            self._intend()
        else:
            self.entry = entry
            with ctx.shielded():
                self.row = Effect.objects.get(task_id=ctx.task_id, seq=entry.seq)
            self.key = key_of(self.row)
            if self._retry_due():
                pass  # the body runs again, with the same key
            else:
                self._resume()
        if self.done:
            self.detail = dict(self.row.detail if self.row else {})
            self._register_compensation()
        ctx.effect_in_flight = self
        # The body runs inside the effect's span (entered last: nothing above may leave it open).
        self._span = tracing.span(f"effect {self.name}", effect=self.name, task_id=ctx.task_id)
        self._span.__enter__()
        return self

    def _intend(self) -> None:
        ctx = self.ctx
        with ctx.shielded(), transaction.atomic():
            task = ctx.owned_task()
            if task.cancel_requested_at is not None:
                raise Cancelled(f"cancellation of task {ctx.task_id} was requested")
            seq = ctx.new_seq()
            key = downstream_key(task.pk, self.name, seq)
            entry = JournalEntry.objects.create(
                task=task, seq=seq, kind=JournalKind.EFFECT, name=self.name, outcome={"key": key}
            )
            self.row = Effect.objects.create(
                task=task,
                seq=seq,
                name=self.name,
                target=self.target,
                downstream_key=key,
                state=EffectState.INTENDED,
                compensable=self.compensate is not None,
            )
            self._event(task, EventKind.EFFECT_INTENDED, target=self.target)
        ctx.append(entry)
        self.entry = entry
        self.key = key

    def _journal_outcome(self) -> dict[str, Any]:
        outcome = self.entry.outcome if self.entry is not None else None
        return dict(outcome) if isinstance(outcome, dict) else {}

    def _retry_due(self) -> bool:
        """True when an earlier leg's body failed with an error its Retry names and this leg
        runs it again: the effect stays intended, the retry is no longer pending. With a
        verify hook, the hook first says whether the failed attempt happened after all."""
        assert self.row is not None and self.entry is not None
        outcome = self._journal_outcome()
        if RETRY_AT not in outcome or self.row.state != EffectState.INTENDED:
            return False
        with self.ctx.shielded():
            cancelled = Task.objects.filter(
                pk=self.row.task_id, cancel_requested_at__isnull=False
            ).exists()
        if cancelled:
            # Cancelled while it waited: the body does not run again (a leg that undoes the
            # task's effects replays up to here, and this one never happened).
            raise Cancelled(f"cancellation of task {self.ctx.task_id} was requested")
        outcome.pop(RETRY_AT)
        with self.ctx.shielded(), transaction.atomic():
            self.ctx.owned_task()
            JournalEntry.objects.filter(pk=self.entry.pk).update(outcome=outcome)
        self.entry.outcome = outcome
        return self.verify is None

    def _resume(self) -> None:
        assert self.row is not None
        state = self.row.state
        if state in (EffectState.CONFIRMED, EffectState.COMPENSATED):
            self.done = True
        elif state == EffectState.FAILED:
            error = self.row.detail.get("error", {})
            raise EffectFailed(
                error.get("message") or f"effect {self.name} failed",
                effect=self.name,
                error_type=error.get("type", ""),
            )
        else:
            if state == EffectState.INTENDED:
                self._settle(
                    EffectState.UNKNOWN,
                    EventKind.EFFECT_UNKNOWN,
                    only_from=(EffectState.INTENDED,),
                    reason="the leg that ran it stopped before recording its outcome",
                )
            self._resolve_unknown()

    def _resolve_unknown(self) -> None:
        assert self.row is not None
        decision = self.row.detail.get("reconciled")
        if decision is not None and not decision.get("happened"):
            self._retry("an operator said it did not happen")
            return
        if self.verify is None:
            self._await_operator("the tool has no verify hook")
        try:
            happened = bool(self.verify(self.key))
        except LegInterrupt:
            raise
        except Exception as exc:
            self._await_operator(f"its verify hook raised {type(exc).__name__}: {exc}")
        if happened:
            self._settle(
                EffectState.CONFIRMED,
                EventKind.EFFECT_VERIFIED,
                only_from=(EffectState.UNKNOWN,),
                detail={"verified": True},
            )
            self.done = True
        else:
            self._retry("its verify hook found it did not happen")

    def _retry(self, why: str) -> None:
        assert self.row is not None
        detail = {k: v for k, v in self.row.detail.items() if k != "reconciled"}
        detail["attempts"] = int(detail.get("attempts", 1)) + 1
        retried = self._settle(
            EffectState.INTENDED,
            EventKind.EFFECT_RETRIED,
            only_from=(EffectState.UNKNOWN,),
            replace_detail=detail,
            reason=why,
        )
        if not retried:
            # Settled meanwhile (an operator confirmed it): decide again from what it is now.
            self._resume()

    def _await_operator(self, why: str) -> NoReturn:
        ctx = self.ctx
        message = (
            f"Effect {self.name!r} (key {self.key}) may or may not have happened: the leg that "
            f"ran it stopped before recording its outcome, and {why}. An operator must "
            "reconcile it in the task's effects ledger; the task waits until then."
        )
        with ctx.shielded(), transaction.atomic():
            task = ctx.owned_task()
            transitions.set_status_message(task_id=task.pk, message=message)
            leases.release(task.pk, ctx.owner, ctx.leg)
            self._event(task, EventKind.EFFECT_NEEDS_RECONCILIATION, reason=why)
        raise AwaitingReconciliation(message)

    # --- leaving: the outcome ------------------------------------------------------------------

    def record(self, **detail: Any) -> None:
        if self.done:
            raise RuntimeError(
                f"effect {self.name!r} already happened on an earlier leg; guard its body with "
                "`if not fx.done:` so the side effect is not repeated"
            )
        self._recorded.update(detail)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        try:
            return self._exit(exc)
        finally:
            self._span.__exit__(exc_type, exc, tb)

    def _exit(self, exc: BaseException | None) -> Literal[False]:
        self.ctx.effect_in_flight = None
        if self.done:
            return False
        if exc is None:
            self._settle(
                EffectState.CONFIRMED,
                EventKind.EFFECT_CONFIRMED,
                only_from=(EffectState.INTENDED, EffectState.UNKNOWN),
                detail=self._recorded,
            )
            self.detail = dict(self._recorded)
            self.done = True
            self._register_compensation()
            return False
        if isinstance(exc, TimeLimitExceeded | LeaseLost):
            # The body was stopped from outside, somewhere in the middle: nobody knows.
            self._settle(
                EffectState.UNKNOWN,
                EventKind.EFFECT_UNKNOWN,
                only_from=(EffectState.INTENDED,),
                reason=f"its body was interrupted: {exc}",
            )
            return False
        if not isinstance(exc, Exception):
            return False  # the process is going down: the next leg finds it intended
        self._maybe_retry(exc)
        message = str(exc) if isinstance(exc, EffectFailed) else f"{type(exc).__name__}: {exc}"
        error_type = exc.error_type if isinstance(exc, EffectFailed) else type(exc).__name__
        self._settle(
            EffectState.FAILED,
            EventKind.EFFECT_FAILED,
            only_from=(EffectState.INTENDED,),
            detail={"error": {"type": error_type, "message": message}},
        )
        raise EffectFailed(message, effect=self.name, error_type=error_type) from exc

    def _maybe_retry(self, exc: Exception) -> None:
        """The body raised EXC: when the effect's Retry names it and attempts are left, the
        effect stays intended, the failed attempt is journaled and the leg ends until the
        next attempt is due (RetryScheduled). Otherwise return: the effect fails."""
        retry = self.retry
        if retry is None or not retry.retries(exc) or self.entry is None:
            return
        attempts = list(self._journal_outcome().get(ATTEMPTS, []))
        attempts.append(
            {"attempt": len(attempts) + 1, "type": type(exc).__name__, "message": str(exc)[:2000]}
        )
        if len(attempts) >= retry.attempts:
            return
        entry = self.entry

        def record(retry_at: str) -> None:
            outcome = {**self._journal_outcome(), ATTEMPTS: attempts, RETRY_AT: retry_at}
            JournalEntry.objects.filter(pk=entry.pk).update(outcome=outcome)
            entry.outcome = outcome
            assert self.row is not None
            self._event(
                Task(id=self.row.task_id),
                EventKind.EFFECT_RETRIED,
                state=EffectState.INTENDED,
                reason=f"attempt {len(attempts)} failed: {type(exc).__name__}: {exc}"[:500],
            )

        self.ctx.suspend_for_retry(name=self.name, attempts=attempts, retry=retry, record=record)

    # --- bookkeeping -----------------------------------------------------------------------

    def _settle(
        self,
        state: str,
        kind: EventKind,
        *,
        only_from: tuple[str, ...],
        detail: dict[str, Any] | None = None,
        replace_detail: dict[str, Any] | None = None,
        **event_detail: Any,
    ) -> bool:
        """Move the effect to STATE (compare-and-set from ONLY_FROM) and record KIND. Return
        False (and reload the row) if it was in another state.

        Fenced like every write of a leg: a leg that lost its lease (taken over, or expired
        by the database's clock) writes nothing and gets LeaseLost. The leg that holds the
        task now finds the effect ``intended`` or ``unknown`` and settles it itself, through
        the verify hook or an operator.
        """
        assert self.row is not None
        row = self.row
        new_detail = (
            replace_detail if replace_detail is not None else {**row.detail, **(detail or {})}
        )
        now = timezone.now()
        settled = state in (EffectState.CONFIRMED, EffectState.FAILED)
        with self.ctx.shielded(), transaction.atomic():
            self.ctx.owned_task()
            changed = Effect.objects.filter(pk=row.pk, state__in=only_from).update(
                state=state,
                detail=new_detail,
                updated_at=now,
                settled_at=now if settled else None,
            )
            if changed:
                self._event(Task(id=row.task_id), kind, state=state, **event_detail)
                if state == EffectState.UNKNOWN:
                    facts = _webhook_detail(self.name, row.seq, row.downstream_key)
                    outbox.write_for_task(row.task_id, kind, detail=facts, now=now)
        if changed:
            row.state, row.detail = state, new_detail
        else:
            row.refresh_from_db()
        return bool(changed)

    def _event(self, task: Task, kind: EventKind, **detail: Any) -> None:
        assert self.row is not None
        event(
            task,
            kind,
            actor_type=Actor.WORKER,
            actor=self.ctx.owner,
            effect=self.name,
            seq=self.row.seq,
            key=self.row.downstream_key,
            leg=self.ctx.leg,
            **detail,
        )

    def _register_compensation(self) -> None:
        if self.compensate is not None and self.row is not None:
            self.ctx.compensations.append(
                Compensation(self.row.pk, self.name, self.key, self.compensate)
            )


def compensate_all(ctx: Leg, *, reason: str) -> None:
    """Undo this task's confirmed effects that have a compensate hook, newest first.

    Run when a leg ends the task without success (cancelled, tool error, protocol error). A
    hook that raises leaves its effect ``confirmed`` and records why.
    """
    for comp in reversed(ctx.compensations):
        with ctx.shielded():
            still = Effect.objects.filter(pk=comp.effect_id, state=EffectState.CONFIRMED).exists()
        if not still:
            continue
        try:
            comp.hook(comp.key)
        except LegInterrupt:
            raise
        except Exception as exc:
            log.warning("compensation failed task=%s effect=%s: %s", ctx.task_id, comp.name, exc)
            with ctx.shielded(), transaction.atomic():
                ctx.owned_task()
                event(Task(id=ctx.task_id), EventKind.EFFECT_COMPENSATION_FAILED,
                      actor_type=Actor.WORKER, actor=ctx.owner, effect=comp.name, key=comp.key,
                      reason=reason, error=f"{type(exc).__name__}: {exc}")  # fmt: skip
            continue
        now = timezone.now()
        with ctx.shielded(), transaction.atomic():
            ctx.owned_task()
            if Effect.objects.filter(pk=comp.effect_id, state=EffectState.CONFIRMED).update(
                state=EffectState.COMPENSATED, updated_at=now
            ):
                event(Task(id=ctx.task_id), EventKind.EFFECT_COMPENSATED,
                      actor_type=Actor.WORKER, actor=ctx.owner, effect=comp.name, key=comp.key,
                      reason=reason)  # fmt: skip


# --- operators ---------------------------------------------------------------------------


class NotReconcilable(ValueError):
    """Only an ``unknown`` effect can be reconciled."""


# The longest note a reconciliation keeps (the task page's form and `manage.py tasks settle`).
RECONCILE_NOTE_MAX = 1000


def reconcile_effect(
    *, effect_id: int, happened: bool, user: AbstractBaseUser, note: str = "", **detail: Any
) -> Effect:
    """Record an operator's answer to "did this unknown effect happen?", with their NOTE.

    ``happened=True`` confirms it (the tool skips it); ``False`` makes the next leg run it
    again with the same downstream key, or, on a finished task (no leg will run again),
    settles it as ``failed``. A working task that was waiting for this decision resumes.
    Raise NotReconcilable for an effect that is not ``unknown``, or that an operator already
    said did not happen (it stays ``unknown`` until the next leg runs it again): a decision is
    never overwritten. DETAIL goes into the timeline's entry (a bulk action names itself).
    """
    username = user.get_username()
    with transaction.atomic():
        task_id = Effect.objects.values_list("task_id", flat=True).get(pk=effect_id)
        task = Task.objects.select_for_update().get(pk=task_id)  # Task first, then the Effect
        effect = Effect.objects.select_for_update().get(pk=effect_id)
        if effect.state != EffectState.UNKNOWN:
            raise NotReconcilable(
                f"effect {effect.name!r} is {effect.state}; only an unknown effect can be reconciled"
            )
        earlier = effect.detail.get("reconciled")
        if earlier:
            raise NotReconcilable(
                f"effect {effect.name!r} was already reconciled by {earlier.get('by')}; "
                "the next leg acts on that decision"
            )
        now = timezone.now()
        decision = {"happened": happened, "by": username, "at": now.isoformat(), "note": note}
        effect.detail = {**effect.detail, "reconciled": decision}
        fields = ["detail", "updated_at"]
        if happened:
            effect.state, effect.settled_at = EffectState.CONFIRMED, now
            fields += ["state", "settled_at"]
        elif task.is_terminal:
            effect.state, effect.settled_at = EffectState.FAILED, now
            fields += ["state", "settled_at"]
        effect.save(update_fields=fields)
        event(task, EventKind.EFFECT_RECONCILED, actor_type=Actor.OPERATOR, actor=username,
              effect=effect.name, seq=effect.seq, key=effect.downstream_key,
              happened=happened, note=note, **detail)  # fmt: skip
        if task.status == Status.WORKING and not task.lease_owner:
            transitions.resume(
                task_id=task.pk,
                actor_type=Actor.OPERATOR,
                actor=username,
                reason="effect_reconciled",
            )
    return effect


def _webhook_detail(name: str, seq: int, key: str) -> dict[str, Any]:
    """What an ``effect.unknown`` webhook says of its effect, beside the task."""
    return {"effect": {"name": name, "seq": seq, "key": key}}


def mark_unknown_intended_of_finished(*, now: datetime | None = None, limit: int = 1000) -> int:
    """Mark ``unknown`` the effects still ``intended`` on finished, unleased tasks past their
    purge moment: the leg that ran them stopped (or was refused its write) before recording
    an outcome, and no leg will run again. Such a task is kept by the purge until an operator
    reconciles the effect, and that needs it ``unknown``. Return how many were marked."""
    now = now or timezone.now()
    stranded = list(
        Effect.objects.filter(
            state=EffectState.INTENDED,
            task__status__in=TERMINAL_STATUSES,
            task__lease_owner="",
            task__expires_at__lte=now,
        ).values_list("pk", "task_id", "name", "seq", "downstream_key")[:limit]
    )
    marked = 0
    for effect_id, task_id, name, seq, key in stranded:
        with transaction.atomic():
            if Effect.objects.filter(pk=effect_id, state=EffectState.INTENDED).update(
                state=EffectState.UNKNOWN, updated_at=now
            ):
                event(Task(id=task_id), EventKind.EFFECT_UNKNOWN, actor_type=Actor.SYSTEM,
                      actor="retention", effect=name, seq=seq, key=key,
                      state=EffectState.UNKNOWN,
                      reason="its task ended before the outcome was recorded")  # fmt: skip
                outbox.write_for_task(task_id, EventKind.EFFECT_UNKNOWN, now=now,
                                      detail=_webhook_detail(name, seq, key))  # fmt: skip
                marked += 1
    return marked
