"""ctx.step(..., retry=Retry(...)) and ctx.effect(..., retry=...): each failed attempt is
journaled, the leg ends and gives the worker back while it waits, and the tool sees the
exception once the attempts run out."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest
from django.utils import timezone

from tasks_app import runtime
from tasks_app.models import Dispatch, JournalEntry
from tasks_app.runtime import LegOutcome
from tasks_app.testing import Kill, ToolRunner, leg, submit
from tasks_app.tools import EffectFailed, Retry, StepFailed, ToolContext, Toolset
from tasks_app.tools.registry import serving

tools = Toolset("retry_tests")
CALLS: Counter[str] = Counter()
FAILURES: dict[str, int] = {}


@pytest.fixture(autouse=True)
def _fresh() -> None:
    CALLS.clear()
    FAILURES.clear()


def flaky(name: str, error: type[Exception] = ConnectionError) -> int:
    CALLS[name] += 1
    if CALLS[name] <= FAILURES.get(name, 0):
        raise error(f"{name} unreachable (call {CALLS[name]})")
    return CALLS[name]


@tools.tool(task="required")
def fetch(ctx: ToolContext, fail: int = 0, error: str = "connection") -> str:
    """A step that fails FAIL times before it works."""
    FAILURES["fetch"] = fail
    kind = {"connection": ConnectionError, "value": ValueError}[error]
    retry = Retry(attempts=5, backoff=2.0, max_delay=60, on=(TimeoutError, ConnectionError))
    try:
        calls = ctx.step("fetch", lambda: flaky("fetch", kind), retry=retry)
    except (ConnectionError, StepFailed) as exc:
        ctx.step("after", lambda: "noted")
        return f"gave up: {type(exc).__name__}: {exc}"
    return f"fetched on call {calls}"


def test_a_step_is_retried_with_backoff_until_it_works(taskdesk: ToolRunner) -> None:
    run = taskdesk.run(fetch, {"fail": 2})
    assert run.text == "fetched on call 3"
    assert run.legs == [LegOutcome.RETRYING, LegOutcome.RETRYING, LegOutcome.COMPLETED]
    assert taskdesk.clock.retried == [4, 8]  # attempt 2 after 4 s, attempt 3 after 8 s
    entry = JournalEntry.objects.get(task=run.task, name="fetch")
    assert entry.outcome["value"] == 3
    assert [(a["attempt"], a["type"]) for a in entry.outcome["attempts"]] == [
        (1, "ConnectionError"),
        (2, "ConnectionError"),
    ]


def test_the_waiting_leg_gives_the_worker_back_and_says_when_it_retries(alice) -> None:
    with serving(tools):
        task = submit(alice, "fetch", fail=1)
        assert leg(task) == LegOutcome.RETRYING
        assert task.status == "working" and task.lease_owner == ""
        assert task.status_message == "retrying fetch (attempt 2 of 5) in 4 s"
        assert not Dispatch.objects.filter(task=task, consumed_at__isnull=True).exists()
        [suspended] = task.events.filter(kind="leg_suspended")
        assert suspended.detail["retry"] == "fetch" and suspended.detail["attempt"] == 2

        assert runtime.dispatch_due_retries() == 0  # not due yet
        later = timezone.now() + timedelta(seconds=5)
        assert runtime.dispatch_due_retries(now=later) == 1
        assert runtime.dispatch_due_retries(now=later) == 0  # one leg is enough
        assert leg(task) == LegOutcome.COMPLETED
        assert task.result["content"][0]["text"] == "fetched on call 2"  # type: ignore[index]


def test_when_the_attempts_run_out_the_tool_sees_the_exception(taskdesk: ToolRunner) -> None:
    run = taskdesk.run(fetch, {"fail": 99})
    assert run.text == "gave up: ConnectionError: fetch unreachable (call 5)"
    assert CALLS["fetch"] == 5 and taskdesk.clock.retried == [4, 8, 16, 32]


def test_a_replay_after_the_last_attempt_sees_the_recorded_failure(taskdesk: ToolRunner) -> None:
    run = taskdesk.run(fetch, {"fail": 99}, kill=Kill("after", "before"))
    assert CALLS["fetch"] == 5  # the replay did not run the step again
    assert run.text == (
        "gave up: StepFailed: ctx.step('fetch') failed after 5 attempts: "
        "ConnectionError: fetch unreachable (call 5)"
    )


def test_an_error_the_retry_does_not_name_is_not_retried(taskdesk: ToolRunner) -> None:
    run = taskdesk.run(fetch, {"fail": 1, "error": "value"})
    assert run.legs == [LegOutcome.COMPLETED] and CALLS["fetch"] == 1
    # An unexpected exception reaches the client as a reference only; its text is logged.
    assert run.is_error and "failed unexpectedly (reference " in run.text
    assert "fetch unreachable" not in run.text
    assert run.journal == []  # not recorded, as any step that raises


def test_a_retry_is_checked_when_it_is_declared() -> None:
    with pytest.raises(ValueError, match="attempts >= 1"):
        Retry(attempts=0)
    with pytest.raises(ValueError, match="exception classes"):
        Retry(on=("TimeoutError",))  # type: ignore[arg-type]
    assert [Retry(max_delay=10).delay(n) for n in (2, 3, 4)] == [4.0, 8.0, 10.0]


SENT: list[str] = []


@tools.tool(task="required")
def send(ctx: ToolContext, fail: int = 0, verify: bool = False) -> str:
    """An effect whose body fails FAIL times before the message goes out."""
    FAILURES["send"] = fail
    retry = Retry(attempts=3, backoff=2.0, on=(TimeoutError,))
    try:
        with ctx.effect(
            "send", verify=(lambda key: key in SENT) if verify else None, retry=retry
        ) as fx:
            if not fx.done:
                flaky("send", TimeoutError)
                SENT.append(fx.key)
                fx.record(sent=True)
    except EffectFailed as exc:
        return f"not sent: {exc}"
    return f"sent after {CALLS['send']} calls"


@pytest.fixture(autouse=True)
def _outbox() -> None:
    SENT.clear()


def test_an_effect_body_is_retried_with_the_same_key(taskdesk: ToolRunner) -> None:
    run = taskdesk.run(send, {"fail": 2})
    assert run.text == "sent after 3 calls"
    assert run.legs == [LegOutcome.RETRYING, LegOutcome.RETRYING, LegOutcome.COMPLETED]
    assert [(e.state, e.detail) for e in run.effects] == [("confirmed", {"sent": True})]
    assert len(SENT) == 1 and SENT[0] == run.effects[0].key
    assert run.events.count("effect_retried") == 2 and "effect_unknown" not in run.events


def test_a_retried_effect_with_a_verify_hook_asks_it_first(taskdesk: ToolRunner) -> None:
    run = taskdesk.run(send, {"fail": 1, "verify": True})
    assert run.text == "sent after 2 calls"
    assert "effect_unknown" in run.events  # the hook said the failed attempt did not happen


def test_an_effect_that_runs_out_of_attempts_fails(taskdesk: ToolRunner) -> None:
    run = taskdesk.run(send, {"fail": 9})
    assert run.text == "not sent: TimeoutError: send unreachable (call 3)"
    assert CALLS["send"] == 3 and [e.state for e in run.effects] == ["failed"]


@tools.tool(task="required")
def reserve_then_send(ctx: ToolContext) -> str:
    """A compensable effect, then an effect body that keeps failing."""
    with ctx.effect("reserve", compensate=lambda key: SENT.append(f"undo {key}")) as fx:
        if not fx.done:
            SENT.append("reserved")
    with ctx.effect("send", retry=Retry(attempts=3, on=(TimeoutError,))) as fx:
        if not fx.done:
            CALLS["send"] += 1
            raise TimeoutError("no answer")
    return "sent"


def test_a_task_cancelled_while_it_waits_to_retry_stops_at_once_and_undoes(alice) -> None:
    from tasks_app import transitions
    from tasks_app.models import Actor

    with serving(tools):
        task = submit(alice, "reserve_then_send")
        assert leg(task) == LegOutcome.RETRYING and CALLS["send"] == 1
        transitions.request_cancel(task_id=task.pk, actor_type=Actor.CLIENT, actor="alice")
        task.refresh_from_db()
        assert task.status == "cancelled"  # nothing was running: at once
        assert leg(task) == LegOutcome.UNDONE  # the undo leg replays the journal...
    assert CALLS["send"] == 1  # ...without sending again
    assert SENT[0] == "reserved" and SENT[1].startswith("undo ")
