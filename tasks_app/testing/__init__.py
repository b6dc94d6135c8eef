"""The testing kit for tool authors: run a tool as a task, in-process, without a broker.

``ToolRunner`` creates the task as acceptance would and runs its legs in the test process
with the real runtime (journal, effects ledger, questions, cancellation checkpoints) on the
test database. It adds what a test needs around that:

- **scripted answers**, per question key: ``answers={"approval": {"approve": True}}`` (an
  ``Answer`` for a decline or a cancel); a question without a scripted answer leaves the task
  waiting, for ``runner.answer(...)`` and ``runner.resume(...)``;
- **a fake clock**: ``ctx.sleep`` advances it instead of sleeping, and ``runner.clock.advance``
  moves it past question deadlines (which then expire as they would on a server);
- **a kill at any journaled call**: ``kill=Kill("charge", moment="after")`` ends the leg there
  as a dead worker would (nothing more is recorded; the lease runs out), and the next leg
  replays the journal, so a test shows what the replay does;
- **an effects record**: ``run.effects`` lists the ledger's rows (name, state, key, detail);
- **a client that cannot answer**: ``elicitation=()`` (or ``("url",)``) runs the task as for a
  client that declared no elicitation (or only URL mode), whose questions go to the inbox or
  fail the task (``elicitations.routing``).

With pytest, the ``taskdesk`` fixture (``tasks_app.pytest_plugin``, loaded by the
``pytest11`` entry point of the taskdesk package) gives a ``ToolRunner`` on pytest-django's
``db``. See docs/tools.md, "Testing a tool".
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, Literal, TypeVar

from django.utils import timezone

from elicitations import transitions as elicitations
from elicitations.models import Audience, Channel, InputRequest, RequestStatus
from tasks_app import dispatch, runtime, transitions
from tasks_app.clients import client_get_or_create
from tasks_app.models import Actor, Client, Dispatch, Effect, JournalEntry, Task
from tasks_app.operators import grant_role
from tasks_app.runtime import LegOutcome
from tasks_app.runtime.retries import retry_due_at
from tasks_app.tools import (
    Answer,
    EffectHandle,
    Question,
    Retry,
    ToolContext,
    Toolset,
    ToolSpec,
    get_tool,
)
from tasks_app.tools.aio import AsyncToolContext
from tasks_app.tools.registry import serving

T = TypeVar("T")

__all__ = [
    "Answer",
    "EffectRecord",
    "FakeClock",
    "Kill",
    "Killed",
    "TaskRun",
    "ToolRunner",
    "after_death",
    "leg",
    "next_dispatch",
    "submit",
]

ENDED = (LegOutcome.COMPLETED, LegOutcome.FAILED, LegOutcome.CANCELLED, LegOutcome.UNDONE)


# --- the building blocks (also used on their own by Taskdesk's tests) ---------------------


def submit(client: Client, tool: str, **arguments: Any) -> Task:
    """A working task of CLIENT with one unpublished dispatch record, as acceptance makes."""
    spec = get_tool(tool)
    assert spec is not None, f"tool {tool} is not enabled"
    task = Task.objects.create(
        client=client, tool_name=tool, arguments=spec.normalize_arguments(arguments)
    )
    dispatch.enqueue(task, reason="accepted")
    return task


def next_dispatch(task: Task) -> int:
    """The newest dispatch record of TASK that no leg has consumed yet."""
    record = Dispatch.objects.filter(task=task, consumed_at__isnull=True).order_by("-pk").first()
    assert record is not None, f"task {task.pk} has no pending dispatch"
    return record.pk


def leg(task: Task) -> LegOutcome:
    """Run the leg the newest dispatch record of TASK asks for, and refresh TASK."""
    outcome = runtime.run_leg(task_id=task.pk, dispatch_id=next_dispatch(task))
    task.refresh_from_db()
    return outcome


def after_death(task: Task) -> LegOutcome:
    """After a leg of TASK died: let its lease run out, run the sweeper, and run the leg the
    sweeper dispatches."""
    Task.objects.filter(pk=task.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert runtime.redispatch_expired_leases() >= 1, f"task {task.pk} had no expired lease"
    return leg(task)


class Killed(BaseException):
    """The worker process dying at this point: nothing records an outcome."""


# --- what a test scripts -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Kill:
    """Kill the leg at a journaled call: the AT-th call (1-based), or the first call named
    AT (a step, effect or question key). ``before``: the call does not run. ``after``: it
    runs (a step's function, an effect's body, a question gets its answer) and the leg dies
    before the runtime records the outcome. Each kill fires once."""

    at: int | str
    moment: Literal["before", "after"] = "after"


class FakeClock:
    """The clock of a ToolRunner. ``ctx.sleep`` advances it at once; ``advance`` moves it on
    (questions whose deadline it passes expire before the next leg)."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or timezone.now()
        self.slept: list[float] = []
        self.retried: list[float] = []  # the waits before retries of steps, in seconds

    def advance(self, by: timedelta | float) -> datetime:
        self.now += by if isinstance(by, timedelta) else timedelta(seconds=by)
        return self.now


@dataclasses.dataclass(frozen=True)
class EffectRecord:
    """One row of the effects ledger."""

    name: str
    state: str
    key: str
    target: str
    detail: dict[str, Any]


@dataclasses.dataclass
class TaskRun:
    """A task run by a ToolRunner: the task and what its legs did."""

    task: Task
    spec: ToolSpec
    legs: list[LegOutcome] = dataclasses.field(default_factory=list)
    kills: list[Kill] = dataclasses.field(default_factory=list)

    def refresh(self) -> TaskRun:
        self.task.refresh_from_db()
        return self

    @property
    def status(self) -> str:
        return str(self.task.status)

    @property
    def result(self) -> dict[str, Any] | None:
        """The CallToolResult of a completed task."""
        return self.task.result

    @property
    def error(self) -> dict[str, Any] | None:
        """The JSON-RPC error of a failed task."""
        return self.task.error

    @property
    def is_error(self) -> bool:
        return bool((self.task.result or {}).get("isError")) or self.task.error is not None

    @property
    def text(self) -> str:
        blocks = (self.task.result or {}).get("content") or []
        return "".join(block.get("text", "") for block in blocks if isinstance(block, dict))

    @property
    def structured(self) -> Any:
        return (self.task.result or {}).get("structuredContent")

    @property
    def effects(self) -> list[EffectRecord]:
        return [
            EffectRecord(e.name, e.state, e.downstream_key, e.target, dict(e.detail or {}))
            for e in Effect.objects.filter(task=self.task).order_by("seq")
        ]

    @property
    def journal(self) -> list[tuple[str, str]]:
        """The journaled calls, as (kind, name)."""
        rows = JournalEntry.objects.filter(task=self.task).order_by("seq")
        return [(str(kind), name) for kind, name in rows.values_list("kind", "name")]

    @property
    def pending(self) -> list[InputRequest]:
        """The questions still waiting for an answer."""
        return list(
            self.task.input_requests.filter(status=RequestStatus.PENDING).order_by("created_at")
        )

    @property
    def events(self) -> list[str]:
        return list(self.task.events.order_by("created_at", "id").values_list("kind", flat=True))


# --- the runner ----------------------------------------------------------------------------


class ToolRunner:
    """Runs tools as tasks in the test process (see the module docstring)."""

    def __init__(
        self, *, client: str = "tests", tenant: str = "tests", clock: FakeClock | None = None
    ) -> None:
        self.client = client_get_or_create(name=client, tenant=tenant)
        self.clock = clock or FakeClock()
        self._operator: Any = None

    def run(
        self,
        tool: str | ToolSpec | Callable[..., Any],
        arguments: Mapping[str, Any] | None = None,
        *,
        answers: Mapping[str, Mapping[str, Any] | Answer] | None = None,
        kill: Kill | Sequence[Kill] | None = None,
        max_legs: int = 50,
        elicitation: Sequence[str] | None = None,
    ) -> TaskRun:
        """Submit TOOL with ARGUMENTS and run legs until the task ends or waits for something
        the script does not provide (an unscripted question, an operator's reconciliation).
        ELICITATION: the elicitation modes the calling client declared (``()``: none); by
        default a client that answers every mode."""
        spec = self._spec(tool)
        with serving(_alone(spec)):
            task = submit(self.client, spec.name, **dict(arguments or {}))
        if elicitation is not None:
            task.client_answers = " ".join(elicitation)
            task.save(update_fields=["client_answers"])
        return self.resume(TaskRun(task, spec), answers=answers, kill=kill, max_legs=max_legs)

    def resume(
        self,
        run: TaskRun,
        *,
        answers: Mapping[str, Mapping[str, Any] | Answer] | None = None,
        kill: Kill | Sequence[Kill] | None = None,
        max_legs: int = 50,
    ) -> TaskRun:
        """Run RUN's next legs, answering its questions from ANSWERS, until it ends or waits."""
        spec = run.spec
        kills = [kill] if isinstance(kill, Kill) else list(kill or [])
        scripted = dict(answers or {})
        for _ in range(max_legs):
            run.refresh()
            elicitations.expire_overdue(now=self.clock.now)
            run.refresh()
            if not Dispatch.objects.filter(task=run.task, consumed_at__isnull=True).exists():
                if not self._answer_scripted(run, scripted):
                    return run
                continue
            probe = _Probe(kills, self.clock)
            try:
                with serving(_alone(dataclasses.replace(spec, func=probe.wrap(spec.func)))):
                    outcome = leg(run.task)
            except Killed:
                run.kills.append(probe.fired[-1])
                with serving(_alone(spec)):
                    # The sweeper's view of a dead worker: its lease runs out.
                    Task.objects.filter(pk=run.task.pk).update(
                        lease_expires_at=timezone.now() - timedelta(seconds=1)
                    )
                    runtime.redispatch_expired_leases()
                run.legs.append(LegOutcome.ABORTED)
                continue
            finally:
                kills = [k for k in kills if k not in probe.fired]
            run.legs.append(outcome)
            if outcome == LegOutcome.RETRYING:
                # The wait passes on the fake clock; then the retry's leg is dispatched.
                due = retry_due_at(run.task.pk)
                assert due is not None, f"task {run.task.pk} retries no step"
                wait = max(0.0, (due - timezone.now()).total_seconds())
                self.clock.retried.append(round(wait))
                self.clock.advance(wait)
                runtime.dispatch_due_retries(task_id=run.task.pk, now=due)
                continue
            if outcome in ENDED or outcome == LegOutcome.AWAITING_OPERATOR:
                return run.refresh()
            if outcome == LegOutcome.SUSPENDED and not self._answer_scripted(run, scripted):
                return run.refresh()
        raise AssertionError(f"task {run.task.pk} did not settle within {max_legs} legs")

    def answer(
        self, run: TaskRun, key: str, content: Mapping[str, Any] | Answer | None = None
    ) -> None:
        """Answer RUN's pending question KEY (the tool's key) as its audience would."""
        request = run.task.input_requests.get(ask_key=key, status=RequestStatus.PENDING)
        if isinstance(content, Answer):
            response: dict[str, Any] = {"action": content.action}
            if content.action == "accept":
                response["content"] = dict(content.content)
        else:
            response = {"action": "accept", "content": dict(content or {})}
        if request.audience == Audience.OPERATOR:
            extra: dict[str, Any] = {"channel": Channel.INBOX, "user": self.operator()}
        else:
            extra = {"channel": Channel.TASKS_UPDATE}
        outcome = elicitations.answer(task=run.task, key=request.key, response=response, **extra)
        assert outcome.recorded, f"the answer to {key!r} was not recorded: {outcome}"

    def cancel(self, run: TaskRun) -> None:
        """Request cancellation, as ``tasks/cancel`` does."""
        transitions.request_cancel(
            task_id=run.task.pk, actor_type=Actor.CLIENT, actor=self.client.name
        )
        run.refresh()

    def operator(self) -> Any:
        """An operator of the runner's tenant (created on first use), who answers inbox
        questions."""
        if self._operator is None:
            from django.contrib.auth import get_user_model

            user = get_user_model().objects.create_user(username=f"operator-{self.client.pk}")
            self.client.tenant.members.add(user)
            grant_role(user, "operator")
            self._operator = user
        return self._operator

    def _spec(self, tool: str | ToolSpec | Callable[..., Any]) -> ToolSpec:
        if isinstance(tool, ToolSpec):
            return tool
        if isinstance(tool, str):
            found = get_tool(tool)
            if found is None:
                raise LookupError(f"tool {tool} is not enabled (TASKDESK_TOOLSETS)")
            return found
        spec = getattr(tool, "tool_spec", None)
        if not isinstance(spec, ToolSpec):
            raise TypeError(f"{tool!r} is not a tool: decorate it with @tools.tool")
        return spec

    def _answer_scripted(self, run: TaskRun, scripted: dict[str, Any]) -> bool:
        """Answer the pending questions the script has answers for; True if any was."""
        answered = False
        for request in run.pending:
            if request.ask_key in scripted:
                self.answer(run, request.ask_key, scripted[request.ask_key])
                answered = True
        return answered


def _alone(spec: ToolSpec) -> Toolset:
    toolset = Toolset(spec.toolset or "testing")
    toolset.tools[spec.name] = spec
    return toolset


class _Probe:
    """Wraps a tool function so that its context dies at the scripted kills."""

    def __init__(self, kills: list[Kill], clock: FakeClock) -> None:
        self.kills = kills
        self.clock = clock
        self.fired: list[Kill] = []

    def wrap(self, func: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.iscoroutinefunction(func):
            # An async tool's context hands each call to the sync context it wraps: probe that.
            async def probed_async(actx: AsyncToolContext, *args: Any, **kwargs: Any) -> Any:
                actx.sync = _ProbedContext(actx.sync, self)
                clock = self.clock

                async def sleep(seconds: float, *, every: float = 0.2) -> None:
                    await actx.check_cancelled()
                    clock.slept.append(seconds)
                    clock.advance(seconds)

                actx.sleep = sleep  # type: ignore[method-assign]
                return await func(actx, *args, **kwargs)

            return probed_async

        def probed(ctx: ToolContext, *args: Any, **kwargs: Any) -> Any:
            return func(_ProbedContext(ctx, self), *args, **kwargs)

        return probed

    def due(self, position: int, name: str, moment: str) -> Kill | None:
        for kill in self.kills:
            if kill in self.fired or kill.moment != moment:
                continue
            if kill.at == position or kill.at == name:
                return kill
        return None

    def die(self, kill: Kill) -> None:
        self.fired.append(kill)
        raise Killed(f"killed {kill.moment} journaled call {kill.at!r}")


class _ProbedContext(ToolContext):
    """The runtime's context, counting journaled calls to die where a Kill says; ``sleep``
    advances the fake clock."""

    def __init__(self, inner: ToolContext, probe: _Probe) -> None:
        self._inner = inner
        self._probe = probe
        self._calls = 0
        self.task_id = inner.task_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    @property
    def client_name(self) -> str:
        return self._inner.client_name

    @property
    def tenant(self) -> str:
        return self._inner.tenant

    def _enter(self, name: str) -> tuple[int, Kill | None]:
        self._calls += 1
        position = self._calls
        before = self._probe.due(position, name, "before")
        if before is not None:
            self._probe.die(before)
        return position, self._probe.due(position, name, "after")

    def ask_many(self, questions: dict[str, Question]) -> dict[str, Answer]:
        after = None
        for key in questions:
            _, due = self._enter(key)
            after = after or due
        answers = self._inner.ask_many(questions)
        if after is not None:
            self._probe.die(after)
        return answers

    def step(self, name: str, fn: Callable[[], T], *, retry: Retry | None = None) -> T:
        _, after = self._enter(name)
        if after is None:
            return self._inner.step(name, fn, retry=retry)

        def then_die() -> T:
            fn()
            self._probe.die(after)
            raise AssertionError("unreachable")

        return self._inner.step(name, then_die, retry=retry)

    def effect(
        self,
        name: str,
        *,
        target: str = "",
        verify: Callable[[str], bool] | None = None,
        compensate: Callable[[str], None] | None = None,
        retry: Retry | None = None,
    ) -> AbstractContextManager[EffectHandle]:
        _, after = self._enter(name)
        scope = self._inner.effect(
            name, target=target, verify=verify, compensate=compensate, retry=retry
        )
        return scope if after is None else _DyingScope(scope, self._probe, after)

    def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        self._inner.progress(done, total, message)

    def log(self, level: str, message: str, **data: Any) -> None:
        self._inner.log(level, message, **data)

    def check_cancelled(self) -> None:
        self._inner.check_cancelled()

    def sleep(self, seconds: float, *, every: float = 0.2) -> None:
        self._inner.check_cancelled()
        self._probe.clock.slept.append(seconds)
        self._probe.clock.advance(seconds)
        self._inner.check_cancelled()

    def chunks(self, total: int, size: int) -> Iterator[range]:
        return self._inner.chunks(total, size)


class _DyingScope(AbstractContextManager[EffectHandle]):
    """An effect whose body runs, after which the worker dies: the runtime never records
    whether it happened (it stays intended)."""

    def __init__(self, scope: AbstractContextManager[EffectHandle], probe: _Probe, kill: Kill):
        self.scope, self.probe, self.kill = scope, probe, kill

    def __enter__(self) -> EffectHandle:
        return self.scope.__enter__()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        if exc is not None:
            return self.scope.__exit__(exc_type, exc, tb)
        self.probe.die(self.kill)
        return None
