"""Run again: a new task with a finished task's tool and arguments, linked both ways.

With **reuse** (the default when the original failed or was cancelled), the new task starts
from the original's journal: the leading run of recorded calls that finished (steps, effects
that were confirmed, questions that were answered) is copied into the new task, so its tool
replays them instead of running them again, and only the rest runs. A copied effect keeps the
downstream key it happened with (``runtime.key_of``), so a verify or compensate hook asks
about the real one. The copy stops at the first call that did not finish (an effect that
failed, was undone or is unknown, a question never answered): from there on, the tool runs.

Without reuse the new task runs from scratch, and the effects the original applied happen
again; the confirmation names them first. A task with an effect whose outcome is ``unknown``
(or ``intended``) is not run again until an operator settles it: nobody knows what it did.

The new task belongs to the original's client, with an idempotency key derived from the
original's (``<key or id>~rerun-<n>``; a bulk action's own ``~bulk-<id>``), so a
double-submitted confirmation runs it once. It is accepted through ``acceptance.accept``,
and its copied journal and effects, the two timeline entries that link the tasks, and the
audit entry are written in the acceptance's transaction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db.models import Count

from elicitations.models import InputRequest, RequestStatus
from tasks_app import acceptance, audit
from tasks_app.models import (
    TERMINAL_STATUSES,
    Actor,
    AuditAction,
    Effect,
    EffectState,
    EventKind,
    JournalEntry,
    JournalKind,
    Status,
    Task,
    event,
)
from tasks_app.runtime.effects import REUSED, downstream_key
from tasks_app.tools import get_tool

UNSETTLED = (EffectState.INTENDED, EffectState.UNKNOWN)
KEY_MAX = 255


def take_over_confirmed(*, original: Task, new: Task, seqs: set[int]) -> int:
    """Copy ORIGINAL's confirmed effects numbered SEQS into NEW's ledger, as confirmed (a run
    again that reuses what happened), each naming the effect it took over and keeping its
    downstream key (``runtime.key_of``). Inside the caller's transaction. Return how many were
    copied."""
    taken = Effect.objects.filter(task=original, seq__in=seqs, state=EffectState.CONFIRMED)
    copies = [
        Effect(
            task=new,
            seq=effect.seq,
            name=effect.name,
            target=effect.target,
            downstream_key=downstream_key(new.pk, effect.name, effect.seq),
            state=EffectState.CONFIRMED,
            compensable=effect.compensable,
            settled_at=effect.settled_at,
            detail={
                **effect.detail,
                REUSED: {"task": original.pk, "seq": effect.seq, "key": effect.downstream_key},
            },
        )
        for effect in taken.order_by("seq")
    ]
    Effect.objects.bulk_create(copies)
    return len(copies)


class NotRerunnable(ValueError):
    """This task cannot be run again (yet): the message says why."""


@dataclass(frozen=True)
class Plan:
    """What running TASK again would do: its effects by state, the key the new task gets,
    how much of its journal would be reused, and why it cannot be run again ("" if it can)."""

    task: Task
    key: str
    reuse_by_default: bool
    effects: dict[str, list[Effect]] = field(default_factory=dict)
    reusable: int = 0  # recorded calls the new task would replay with reuse
    replayed: list[Effect] = field(default_factory=list)  # the effects among them
    blocked: str = ""

    @property
    def applied(self) -> list[Effect]:
        """The effects that happened: with reuse they are replayed, without it they run again."""
        return self.effects.get(EffectState.CONFIRMED, [])


def plan(task: Task, *, key: str = "") -> Plan:
    effects: dict[str, list[Effect]] = {}
    for effect in Effect.objects.filter(task=task).order_by("seq"):
        effects.setdefault(effect.state, []).append(effect)
    blocked = ""
    if task.status not in TERMINAL_STATUSES:
        blocked = f"The task has not finished ({task.status}): cancel it first, or wait."
    elif any(effects.get(state) for state in UNSETTLED):
        names = ", ".join(e.name for state in UNSETTLED for e in effects.get(state, []))
        blocked = (
            f"Effect {names} may or may not have happened: settle it before running the task again."
        )
    elif get_tool(task.tool_name) is None:
        blocked = f"Tool {task.tool_name!r} is no longer served (its toolset is not loaded)."
    reusable = _reusable(task)
    copied = {e.seq for e in reusable if e.kind == JournalKind.EFFECT}
    return Plan(
        task=task,
        key=key or derived_key(task),
        reuse_by_default=reuses_by_default(task),
        effects=effects,
        reusable=len(reusable),
        replayed=[e for e in effects.get(EffectState.CONFIRMED, []) if e.seq in copied],
        blocked=blocked,
    )


def reuses_by_default(task: Task) -> bool:
    """Whether running TASK again reuses its journal unless told otherwise: when it failed,
    was cancelled or ended with a tool error (a success is usually run again to redo it)."""
    return task.status in (Status.FAILED, Status.CANCELLED) or task.is_error


def derived_key(task: Task, *, suffix: str = "") -> str:
    """The idempotency key of TASK's next run again: the original's key (or id), then
    ``~rerun-<n>`` (n counts its runs again), or SUFFIX."""
    base = task.idempotency_key or task.pk
    if not suffix:
        done = Task.objects.filter(rerun_of=task).aggregate(n=Count("pk"))["n"]
        suffix = f"~rerun-{done + 1}"
    return base[: KEY_MAX - len(suffix)] + suffix


def run_again(task: Task, *, reuse: bool, who: audit.Who, key: str = "", bulk: int = 0) -> Task:
    """Accept the task that runs TASK again (with REUSE, from its journal), as WHO; return it.
    KEY: the idempotency key (``derived_key`` by default). BULK: the bulk action doing it.
    Raise NotRerunnable when ``plan`` says it cannot be run again. A second call with the same
    key returns the task the first created."""
    planned = plan(task, key=key)
    if planned.blocked:
        raise NotRerunnable(planned.blocked)
    spec = get_tool(task.tool_name)
    assert spec is not None  # plan() checked
    entries = _reusable(task) if reuse else []
    journal = [
        {"seq": e.seq, "kind": e.kind, "name": e.name, "outcome": _outcome(e)} for e in entries
    ]
    copied = {e.seq for e in entries if e.kind == JournalKind.EFFECT}

    def linked(new: Task) -> None:
        take_over_confirmed(original=task, new=new, seqs=copied)
        detail: dict[str, Any] = {"reuse": reuse, "replayed": len(entries)}
        if bulk:
            detail["bulk"] = bulk
        event(new, EventKind.RUN_AGAIN_FROM, actor_type=Actor.OPERATOR, actor=who.actor,
              original=task.pk, **detail)  # fmt: skip
        event(task, EventKind.RAN_AGAIN, actor_type=Actor.OPERATOR, actor=who.actor,
              rerun=new.pk, **detail)  # fmt: skip
        if not bulk:  # a bulk action has its own one audit entry
            audit.record(who, AuditAction.TASK_RERUN, tenant=task.client.tenant_id,
                         target=f"task:{task.pk}", new_task=new.pk, reuse=reuse,
                         replayed=len(entries), key=new.idempotency_key or "")  # fmt: skip

    receipt = acceptance.accept(
        client=task.client,
        tool=spec,
        arguments=task.arguments,
        era=task.era,
        key=acceptance.IdempotencyKey(planned.key, "rerun"),
        journal=journal,
        client_answers=task.client_answers,
        rerun_of=task,
        also=linked,
    )
    return receipt.task


def _reusable(task: Task) -> list[JournalEntry]:
    """The leading run of TASK's journal whose calls finished: steps, confirmed effects and
    answered questions, up to the first that did not."""
    effects = dict(Effect.objects.filter(task=task).values_list("seq", "state"))
    kept = []
    for entry in JournalEntry.objects.filter(task=task).order_by("seq"):
        if entry.kind == JournalKind.EFFECT and effects.get(entry.seq) != EffectState.CONFIRMED:
            break
        if entry.kind == JournalKind.ASK and _outcome(entry) is None:
            break
        kept.append(entry)
    return kept


def _outcome(entry: JournalEntry) -> Any:
    """ENTRY's outcome as the new task's journal keeps it: a question answered through the
    inbox or a client is copied as its answer (the question itself stays the original's);
    None for a question nobody answered."""
    outcome = entry.outcome if isinstance(entry.outcome, dict) else {}
    if entry.kind != JournalKind.ASK or "action" in outcome:
        return entry.outcome
    request = InputRequest.objects.filter(task_id=entry.task_id, key=outcome.get("request")).first()
    if request is None or request.status == RequestStatus.PENDING:
        return None
    answer = request.answer if isinstance(request.answer, dict) else {}
    action = answer.get("action")
    if not action:
        return None  # expired or closed without an answer: the question is asked again
    content = answer.get("content") if action == "accept" else None
    return {"action": action, "content": dict(content or {})}
