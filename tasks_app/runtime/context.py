"""``TaskContext``: the ``ToolContext`` a tool function gets inside a task leg.

The journal. ``ctx.ask``, ``ctx.effect`` and ``ctx.step`` are journaled by call order: the
n-th journaled call of a leg is matched with the n-th ``JournalEntry`` of the task (ordered
by ``seq``). A call with a recorded entry returns the recorded outcome instead of running; a
call past the end of the journal runs and appends an entry. A call whose kind or name differs
from the recorded entry at its position ends the task: the tool is not deterministic.

Journal entry outcomes (other writers, such as acceptance after synchronous MRTR rounds,
use the same shapes):

- ``ask``: ``{"request": <InputRequest key>}`` while the question lives in the elicitations
  app, or ``{"action": "accept"|"decline"|"cancel", "content": {...}}`` for an answer
  recorded directly;
- ``step``: ``{"value": <JSON>}``;
- ``effect``: ``{"key": <downstream key>}``; the state lives in the ``Effect`` row with the
  same ``seq``.

Checkpoints. Every ctx call first checks that the lease is still this leg's, that the leg is
within its time limit, and that cancellation was not requested. The last check waits inside
an effect body (an effect in flight settles and is recorded first) and while the leg is still
replaying effects recorded by earlier legs (so their compensate hooks are known).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import timedelta
from functools import cached_property
from typing import Any, Literal, NoReturn, TypeVar, cast

from django.db import DatabaseError, transaction
from django.utils import timezone

from elicitations import transitions as elicitations
from elicitations.models import Audience, InputRequest, Mode, RequestStatus
from tasks_app import dispatch, transitions
from tasks_app.models import (
    Actor,
    Client,
    EventKind,
    JournalEntry,
    JournalKind,
    Status,
    Task,
    event,
)
from tasks_app.runtime import leases
from tasks_app.runtime.effects import Compensation, EffectScope
from tasks_app.runtime.errors import (
    LeaseLost,
    LegAborted,
    NotDeterministic,
    RetryScheduled,
    Suspended,
    TimeLimitExceeded,
    Yielded,
)
from tasks_app.runtime.retries import ATTEMPTS, RETRY_AT
from tasks_app.tools import Answer, Cancelled, Question, Retry, StepFailed, ToolContext, ToolSpec
from tasks_app.tools.context import EffectHandle

T = TypeVar("T")

log = logging.getLogger("tasks_app.runtime")

# How often a checkpoint reads the cancellation flag from the database. A loop of cheap
# checkpoints (``ctx.chunks``) then costs at most ten reads a second; a cancelled
# ``slow_echo`` still stops within a fifth of a second of the request.
CANCEL_POLL_SECONDS = 0.1
# How often a running leg asks whether its tenant holds more than its share of the running
# legs while another tenant waits (TASKDESK_TENANT_LEG_SHARE); a leg shorter than this never
# asks.
SHARE_POLL_SECONDS = 0.5
# Progress is a status-message write; more often than this is noise nobody can read.
PROGRESS_WRITE_SECONDS = 0.25
NAME_MAX = 200
# However many attempts a Retry asks for, a step runs at most this often.
MAX_ATTEMPTS = 100

ANSWER_ACTIONS: dict[str, Literal["accept", "decline", "cancel"]] = {
    RequestStatus.ANSWERED: "accept",
    RequestStatus.DECLINED: "decline",
    RequestStatus.CANCELLED: "cancel",
    RequestStatus.EXPIRED: "decline",
}


def answer_of(request: InputRequest) -> Answer | None:
    """What the tool receives for REQUEST (None while it is pending)."""
    if request.status == RequestStatus.PENDING:
        return None
    stored = request.answer if isinstance(request.answer, dict) else {}
    action = stored.get("action") or ANSWER_ACTIONS[RequestStatus(request.status)]
    content = stored.get("content") if action == "accept" else None
    return Answer(action=action, content=dict(content or {}))


def _json_value(value: Any, *, what: str) -> Any:
    """VALUE as it will read back from the journal (tuples become lists, and so on)."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} must return JSON data (it is journaled): {exc}") from None


def _check_name(kind: str, name: object) -> str:
    if not isinstance(name, str) or not name or len(name) > NAME_MAX:
        raise ValueError(f"ctx.{kind} needs a name of 1 to {NAME_MAX} characters, not {name!r}")
    return name


class TaskContext(ToolContext):
    """The context of one leg of one task (see the module docstring)."""

    def __init__(
        self,
        *,
        task: Task,
        spec: ToolSpec,
        owner: str,
        has_journal: bool = True,
        cancel_checked: bool = False,
    ) -> None:
        self.task = task
        self.spec = spec
        self.owner = owner
        self.task_id: str = task.pk
        self.leg = task.leg
        self.lease: leases.Lease | None = None
        # Set by run_leg when the tool has a time limit (monotonic clock).
        self.deadline: float | None = None
        self.time_limit: float | None = None
        # The claim says whether the task has a journal at all: most first legs have none.
        self.journal: list[JournalEntry] = (
            list(JournalEntry.objects.filter(task_id=task.pk).order_by("seq"))
            if has_journal
            else []
        )
        self.cursor = 0
        # While the replay has not yet passed the last recorded effect, a cancellation
        # request waits: replaying those effects (which never runs them again) registers their
        # compensate hooks, so a cancelled task can undo what earlier legs did.
        self._replaying_effects_until = max(
            (i for i, e in enumerate(self.journal) if e.kind == JournalKind.EFFECT), default=-1
        )
        self.effect_in_flight: EffectScope | None = None
        self.compensations: list[Compensation] = []
        self._shield_depth = 0
        self._alarm_pending = False
        # CANCEL_CHECKED: the claim, a moment ago, found no cancellation requested, which
        # counts as the first poll (CANCEL_POLL_SECONDS).
        self._cancel_checked_at = time.monotonic() if cancel_checked else float("-inf")
        self._progress_written_at = float("-inf")
        self._share_checked_at = time.monotonic()

    @cached_property
    def _client(self) -> Client:
        return Client.objects.select_related("tenant").get(pk=self.task.client_id)

    @property
    def client_name(self) -> str:
        return self._client.name

    @property
    def tenant(self) -> str:
        return self._client.tenant.slug

    # --- runtime plumbing ----------------------------------------------------------------

    @contextmanager
    def shielded(self) -> Iterator[None]:
        """Run runtime bookkeeping: a time-limit alarm waits until it is done (see legs.py),
        and a database failure aborts the leg instead of surfacing as a tool error."""
        self._shield_depth += 1
        try:
            yield
        except DatabaseError as exc:
            raise LegAborted(f"database error in the runtime: {exc}") from exc
        finally:
            self._shield_depth -= 1
        if self._shield_depth == 0 and self._alarm_pending:
            self._alarm_pending = False
            raise TimeLimitExceeded(self.time_limit or 0)

    def on_alarm(self) -> None:
        """The time-limit alarm fired: stop the tool now, or right after the bookkeeping."""
        if self._shield_depth:
            self._alarm_pending = True
        else:
            raise TimeLimitExceeded(self.time_limit or 0)

    def owned_task(self) -> Task:
        """Lock the task row if this leg still holds its lease (its owner and generation, not
        expired by the database's clock), inside the caller's transaction: the fence of
        every write the leg makes. Raise LeaseLost, so that the leg writes nothing, if not."""
        task = leases.lock(self.task_id, self.owner, self.leg)
        if task is None:
            log.warning("writes refused task=%s leg=%s: the lease is lost", self.task_id, self.leg)
            raise LeaseLost(f"task {self.task_id}: leg {self.leg} no longer holds its lease")
        return task

    def checkpoint(self, *, fresh: bool = False) -> None:
        """Raise if the leg must stop: lease lost, time limit passed, cancellation requested,
        or its tenant over its share of the running legs while another waits (the last two
        not inside an effect body: an effect in flight settles)."""
        if self.lease is not None and self.lease.lost.is_set():
            raise LeaseLost(f"task {self.task_id}: another leg took the lease over")
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise TimeLimitExceeded(self.time_limit or 0)
        if self.effect_in_flight is not None or self.cursor <= self._replaying_effects_until:
            return
        if self.task.status == Status.CANCELLED:  # a leg that undoes a cancelled task's effects
            raise Cancelled(f"task {self.task_id} was cancelled")
        now = time.monotonic()
        if fresh or now - self._cancel_checked_at >= CANCEL_POLL_SECONDS:
            self._cancel_checked_at = now
            with self.shielded():
                requested = Task.objects.filter(
                    pk=self.task_id, cancel_requested_at__isnull=False
                ).exists()
            if requested:
                raise Cancelled(f"cancellation of task {self.task_id} was requested")
        # After the cancellation check: a cancelled task stops rather than gives way.
        if now - self._share_checked_at >= SHARE_POLL_SECONDS:
            self._share_checked_at = now
            self._give_way_if_over_share()

    def _give_way_if_over_share(self) -> None:
        """End this leg, to run again later, when its tenant holds more than its share of the
        running legs while another tenant's task waits (``leases.over_share``): the lease is
        released and the task dispatched again, and the freed worker's next claim takes the
        waiting tenant's task (the claim is fair across tenants)."""
        with self.shielded():
            if not leases.over_share(self.task_id, self._client.tenant_id):
                return
            with transaction.atomic():
                task = self.owned_task()  # the fence: a leg that lost its lease does nothing
                self._stop_leg(task, reason="tenant_share")
                dispatch.enqueue(task, reason="tenant_share")
        log.info(
            "leg gave way task=%s leg=%s: its tenant is over its share", self.task_id, self.leg
        )
        raise Yielded("gave its worker to another tenant's waiting task")

    def _stop_leg(self, task: Task, **detail: Any) -> None:
        """Give this leg's lease up and record why the leg stopped before its task's end
        (``leg_suspended`` with DETAIL), inside the caller's transaction, which has checked
        the fence (``owned_task``)."""
        leases.release(task.pk, self.owner, self.leg)
        event(
            task,
            EventKind.LEG_SUSPENDED,
            actor_type=Actor.WORKER,
            actor=self.owner,
            leg=self.leg,
            **detail,
        )

    def forbid_in_effect(self, call: str) -> None:
        if self.effect_in_flight is not None:
            raise RuntimeError(
                f"{call} cannot be called inside the body of ctx.effect("
                f"{self.effect_in_flight.name!r}): an effect body holds only the side effect"
            )

    def next_entry(self, kind: str, name: str) -> JournalEntry | None:
        """Take the next journal position for a KIND call named NAME: return its recorded
        entry, or None past the end of the journal. Raise NotDeterministic on a mismatch."""
        position = self.cursor
        self.cursor += 1
        if position >= len(self.journal):
            return None
        entry = self.journal[position]
        if entry.kind != kind or entry.name != name:
            raise self.not_deterministic(position, recorded=entry, kind=kind, name=name)
        return entry

    def new_seq(self) -> int:
        # Positions, not seq values, are matched; seq only orders the entries. Entries other
        # writers recorded may start anywhere.
        return self.journal[-1].seq + 1 if self.journal else 0

    def append(self, entry: JournalEntry) -> None:
        self.journal.append(entry)

    def not_deterministic(
        self, position: int, *, recorded: JournalEntry | None, kind: str | None, name: str | None
    ) -> NotDeterministic:
        def call(k: str | None, n: str | None) -> str:
            return "no further journaled call" if k is None else f"ctx.{k}({n!r})"

        before = call(recorded.kind, recorded.name) if recorded else call(None, None)
        now = call(kind, name)
        message = (
            f"Tool {self.spec.name} is not deterministic: journaled call #{position + 1} was "
            f"{before} on an earlier leg but is {now} on leg {self.leg}. A tool must make the "
            "same ctx.ask, ctx.effect and ctx.step calls in the same order on every leg; "
            "anything that varies between legs belongs inside ctx.step."
        )
        data = {
            "reason": "non_deterministic",
            "position": position + 1,
            "recorded": {"kind": recorded.kind, "name": recorded.name} if recorded else None,
            "called": {"kind": kind, "name": name} if kind else None,
        }
        return NotDeterministic(message, data)

    def check_journal_consumed(self) -> None:
        """At the end of the function: every recorded call must have been made again."""
        if self.cursor < len(self.journal):
            raise self.not_deterministic(
                self.cursor, recorded=self.journal[self.cursor], kind=None, name=None
            )

    # --- ToolContext -----------------------------------------------------------------------

    def check_cancelled(self) -> None:
        self.checkpoint()

    def ask_many(self, questions: dict[str, Question]) -> dict[str, Answer]:
        self.checkpoint()
        self.forbid_in_effect("ctx.ask")
        start = self.cursor
        answers: dict[str, Answer] = {}
        unanswered: list[str] = []
        new: list[tuple[str, Question]] = []
        for key, question in questions.items():
            entry = self.next_entry(JournalKind.ASK, _check_name("ask", key))
            if entry is None:
                new.append((key, question))
                continue
            answer = self._recorded_answer(entry)
            if answer is None:
                unanswered.append(key)
            else:
                answers[key] = answer
        if new or unanswered:
            try:
                self._suspend(new, unanswered)
            except (Suspended, LeaseLost, Cancelled, LegAborted):
                raise
            except Exception:
                # A refused question (bad schema, ...) reaches the tool; nothing was recorded,
                # so the journal positions it took are free again.
                self.cursor = start
                raise
        return answers

    def _recorded_answer(self, entry: JournalEntry) -> Answer | None:
        outcome = entry.outcome if isinstance(entry.outcome, dict) else {}
        if "action" in outcome:
            return Answer(action=outcome["action"], content=dict(outcome.get("content") or {}))
        with self.shielded():
            request = InputRequest.objects.filter(
                task_id=self.task_id, key=outcome.get("request")
            ).first()
        if request is None:
            raise LegAborted(f"journal entry {entry.seq} of task {self.task_id} names no request")
        return answer_of(request)

    def _suspend(self, new: list[tuple[str, Question]], unanswered: list[str]) -> None:
        """Open NEW questions, record them in the journal, and end the leg waiting for them
        and for UNANSWERED ones: all in one transaction with the lease release, so an answer
        that arrives at once finds the leg gone and dispatches the next one."""
        entries: list[JournalEntry] = []
        with self.shielded(), transaction.atomic():
            task = self.owned_task()
            if task.cancel_requested_at is not None:
                raise Cancelled(f"cancellation of task {self.task_id} was requested")
            for key, q in new:
                request = elicitations.open_request(
                    task=task,
                    ask_key=key,
                    mode=Mode.URL if q.url else Mode.FORM,
                    message=q.message,
                    schema=q.schema,
                    url=q.url or "",
                    audience=q.audience,
                    deadline=q.deadline,
                    on_timeout=q.on_timeout,
                    default=q.default,
                )
                seq = entries[-1].seq + 1 if entries else self.new_seq()
                entries.append(
                    JournalEntry.objects.create(
                        task=task,
                        seq=seq,
                        kind=JournalKind.ASK,
                        name=key,
                        outcome={"request": request.key},
                    )
                )
            pending = list(
                InputRequest.objects.filter(task=task, status=RequestStatus.PENDING)
                .order_by("created_at", "id")
                .values_list("audience", "message")
            )
            for_client = [m for a, m in pending if a != Audience.OPERATOR]
            if for_client:
                transitions.require_input(task_id=task.pk, message=for_client[0], actor=self.owner)
            else:
                first = pending[0][1] if pending else ""
                transitions.set_status_message(
                    task_id=task.pk, message=f"Waiting for an operator in the inbox: {first}"
                )
            self._stop_leg(task, waiting_for=[key for key, _ in new] + unanswered)
        self.journal.extend(entries)
        raise Suspended(f"waiting for {len(pending)} answer(s)")

    def effect(
        self,
        name: str,
        *,
        target: str = "",
        verify: Callable[[str], bool] | None = None,
        compensate: Callable[[str], None] | None = None,
        retry: Retry | None = None,
    ) -> AbstractContextManager[EffectHandle]:
        return EffectScope(
            self,
            _check_name("effect", name),
            target=str(target)[:500],
            verify=verify,
            compensate=compensate,
            retry=retry,
        )

    def step(self, name: str, fn: Callable[[], T], *, retry: Retry | None = None) -> T:
        self.checkpoint()
        self.forbid_in_effect("ctx.step")
        start = self.cursor
        entry = self.next_entry(JournalKind.STEP, _check_name("step", name))
        outcome = entry.outcome if entry is not None and isinstance(entry.outcome, dict) else {}
        if entry is not None and "value" in outcome:
            return cast(T, outcome.get("value"))
        if entry is not None and "failed" in outcome:
            failed = outcome["failed"]
            raise StepFailed(
                f"ctx.step({name!r}) failed after {len(outcome.get(ATTEMPTS, []))} attempts: "
                f"{failed['type']}: {failed['message']}",
                step=name,
                error_type=failed["type"],
                attempts=len(outcome.get(ATTEMPTS, [])),
            )
        attempts: list[dict[str, Any]] = list(outcome.get(ATTEMPTS, []))
        attempt = len(attempts) + 1
        try:
            value = _json_value(fn(), what=f"ctx.step({name!r})")
        except Exception as exc:
            if retry is None or (entry is None and not retry.retries(exc)):
                # A step that raised is not recorded: a later leg runs it again.
                self.cursor = start
                raise
            attempts.append(
                {"attempt": attempt, "type": type(exc).__name__, "message": str(exc)[:2000]}
            )
            if retry.retries(exc) and attempt < min(retry.attempts, MAX_ATTEMPTS):
                self._schedule_retry(entry, name, attempts, retry)
            # Out of attempts (or not retryable after earlier attempts): recorded, so every
            # later leg sees the same failure at this point; this leg sees the exception.
            self._record_step(entry, name, {ATTEMPTS: attempts, "failed": attempts[-1]})
            raise
        except BaseException:
            self.cursor = start
            raise
        self._record_step(
            entry, name, {"value": value, **({ATTEMPTS: attempts} if attempts else {})}
        )
        return cast(T, value)

    def _record_step(self, entry: JournalEntry | None, name: str, outcome: dict[str, Any]) -> None:
        """Write the step's outcome: a new journal entry, or the one of its earlier attempts."""
        with self.shielded(), transaction.atomic():
            task = self.owned_task()
            if entry is None:
                recorded = JournalEntry.objects.create(
                    task=task,
                    seq=self.new_seq(),
                    kind=JournalKind.STEP,
                    name=name,
                    outcome=outcome,
                )
                self.append(recorded)
            else:
                JournalEntry.objects.filter(pk=entry.pk).update(outcome=outcome)
                entry.outcome = outcome

    def _schedule_retry(
        self,
        entry: JournalEntry | None,
        name: str,
        attempts: list[dict[str, Any]],
        retry: Retry,
    ) -> NoReturn:
        """Journal the step's failed attempt and end the leg until the next one is due."""

        def record(retry_at: str) -> None:
            self._record_step(entry, name, {ATTEMPTS: attempts, RETRY_AT: retry_at})

        self.suspend_for_retry(name=name, attempts=attempts, retry=retry, record=record)

    def suspend_for_retry(
        self,
        *,
        name: str,
        attempts: list[dict[str, Any]],
        retry: Retry,
        record: Callable[[str], None],
    ) -> NoReturn:
        """A step's or an effect's body failed and will run again: RECORD the failed ATTEMPTS
        (given when the next attempt is due), say when it runs, give the worker back, and
        schedule the leg that runs it (see ``runtime.retries``)."""
        attempt = len(attempts) + 1
        delay = retry.delay(attempt)
        retry_at = timezone.now() + timedelta(seconds=delay)
        total = min(retry.attempts, MAX_ATTEMPTS)
        message = f"retrying {name} (attempt {attempt} of {total}) in {delay:g} s"
        with self.shielded(), transaction.atomic():
            task = self.owned_task()  # the fence first: a leg that lost its lease records nothing
            record(retry_at.isoformat())
            if task.cancel_requested_at is not None:
                raise Cancelled(f"cancellation of task {self.task_id} was requested")
            transitions.set_status_message(task_id=task.pk, message=message)
            self._stop_leg(
                task,
                retry=name,
                attempt=attempt,
                of=total,
                error=f"{attempts[-1]['type']}: {attempts[-1]['message']}"[:500],
                delay_seconds=delay,
            )
            dispatch.publish_later(task.pk, seconds=delay)
        log.info("retry task=%s leg=%s %s", self.task_id, self.leg, message)
        raise RetryScheduled(message)

    def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        self.checkpoint()
        now = time.monotonic()
        final = total is not None and done >= total
        if not final and now - self._progress_written_at < PROGRESS_WRITE_SECONDS:
            return
        self._progress_written_at = now
        counts = f"{done:g}/{total:g}" if total is not None else f"{done:g}"
        text = f"{message} ({counts})" if message else counts
        with self.shielded(), transaction.atomic():
            self.owned_task()
            transitions.set_status_message(task_id=self.task_id, message=text)

    def log(self, level: str, message: str, **data: Any) -> None:
        self.checkpoint()
        levelno = logging.getLevelName(level.upper())
        extra = f" data={json.dumps(data, default=str, sort_keys=True)}" if data else ""
        log.log(
            levelno if isinstance(levelno, int) else logging.INFO,
            "tool log task=%s leg=%s tool=%s message=%s%s",
            self.task_id,
            self.leg,
            self.spec.name,
            json.dumps(message),
            extra,
        )
