"""tasks_app.testing: the tool authors' kit, used the way an author's own tests use it.

The tools are declared here, in a toolset no setting enables: the runner serves them.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

import pytest

from tasks_app.runtime import LegOutcome
from tasks_app.testing import Answer, EffectRecord, Kill, ToolRunner
from tasks_app.tools import ToolContext, Toolset

tools = Toolset("kit_tests")
RAN: Counter[str] = Counter()
SENT: list[str] = []  # the "outside world" the effect writes to

FORM = {"type": "object", "properties": {"ok": {"type": "boolean"}}}


@pytest.fixture(autouse=True)
def _fresh() -> None:
    RAN.clear()
    SENT.clear()


@tools.tool(task="required")
def order(ctx: ToolContext, item: str, verify: bool = True) -> dict[str, Any]:
    """A step, a question, an effect: the shape of most real tools."""

    def price() -> int:
        RAN["price"] += 1
        return 1200

    cents = ctx.step("price", price)
    answer = ctx.ask("ok", message=f"Buy {item} for {cents}?", schema=FORM)
    if not (answer.accepted and answer.content.get("ok")):
        return {"bought": False}
    with ctx.effect("buy", target=item, verify=(lambda key: key in SENT) if verify else None) as fx:
        if not fx.done:
            RAN["buy"] += 1
            SENT.append(fx.key)
            fx.record(order_id="o-1")
    return {"bought": True, "cents": cents, "order": fx.detail["order_id"]}


@tools.tool(task="required")
def nap(ctx: ToolContext, hours: float) -> str:
    """Sleeps, then asks an operator with a deadline."""
    ctx.sleep(hours * 3600)
    answer = ctx.ask(
        "go",
        message="Go on?",
        schema=FORM,
        audience="operator",
        deadline=timedelta(hours=1),
        on_timeout="decline",
    )
    return answer.action


def test_a_run_answers_from_the_script_and_records_effects(taskdesk: ToolRunner) -> None:
    run = taskdesk.run(order, {"item": "lamp"}, answers={"ok": {"ok": True}})
    assert run.status == "completed" and not run.is_error
    assert run.structured == {"bought": True, "cents": 1200, "order": "o-1"}
    assert run.legs == [LegOutcome.SUSPENDED, LegOutcome.COMPLETED]
    assert run.journal == [("step", "price"), ("ask", "ok"), ("effect", "buy")]
    [effect] = run.effects
    assert effect == EffectRecord("buy", "confirmed", SENT[0], "lamp", {"order_id": "o-1"})
    assert RAN == {"price": 1, "buy": 1}


def test_a_declined_answer_is_scripted_with_an_answer(taskdesk: ToolRunner) -> None:
    run = taskdesk.run(order, {"item": "lamp"}, answers={"ok": Answer(action="decline")})
    assert run.structured == {"bought": False} and run.effects == []


def test_an_unscripted_question_leaves_the_task_waiting(taskdesk: ToolRunner) -> None:
    run = taskdesk.run(order, {"item": "lamp"})
    assert run.status == "input_required"
    assert [r.message for r in run.pending] == ["Buy lamp for 1200?"]
    taskdesk.answer(run, "ok", {"ok": True})
    assert taskdesk.resume(run).status == "completed"
    assert RAN["price"] == 1  # the replay got the journaled price


def test_a_kill_after_an_effect_body_is_verified_on_the_replay(taskdesk: ToolRunner) -> None:
    run = taskdesk.run(
        order, {"item": "lamp"}, answers={"ok": {"ok": True}}, kill=Kill("buy", "after")
    )
    assert run.kills == [Kill("buy", "after")]
    assert run.legs == [LegOutcome.SUSPENDED, LegOutcome.ABORTED, LegOutcome.COMPLETED]
    assert RAN["buy"] == 1 and len(SENT) == 1  # verify said it happened: not bought twice
    assert [e.state for e in run.effects] == ["confirmed"]
    assert "effect_unknown" in run.events and "lease_expired" in run.events


def test_a_kill_after_an_unverifiable_effect_waits_for_an_operator(taskdesk: ToolRunner) -> None:
    run = taskdesk.run(
        order,
        {"item": "lamp", "verify": False},
        answers={"ok": {"ok": True}},
        kill=Kill("buy"),
    )
    assert run.legs[-1] == LegOutcome.AWAITING_OPERATOR and run.status == "working"
    assert [e.state for e in run.effects] == ["unknown"]


def test_a_kill_after_a_step_runs_the_step_again(taskdesk: ToolRunner) -> None:
    run = taskdesk.run(
        order, {"item": "lamp"}, answers={"ok": {"ok": True}}, kill=Kill("price", "after")
    )
    assert run.status == "completed" and RAN["price"] == 2  # its value was never recorded


def test_a_kill_before_the_second_call_by_position(taskdesk: ToolRunner) -> None:
    run = taskdesk.run(
        order, {"item": "lamp"}, answers={"ok": {"ok": True}}, kill=Kill(2, "before")
    )
    assert run.legs[:2] == [LegOutcome.ABORTED, LegOutcome.SUSPENDED]
    assert run.status == "completed" and RAN["price"] == 1


def test_the_fake_clock_sleeps_at_once_and_expires_questions(taskdesk: ToolRunner) -> None:
    run = taskdesk.run(nap, {"hours": 5})
    assert taskdesk.clock.slept == [5 * 3600]
    assert run.status == "working" and [r.audience for r in run.pending] == ["operator"]
    taskdesk.clock.advance(timedelta(hours=2))  # past the question's deadline
    assert taskdesk.resume(run).text == "decline"


def test_an_operator_question_is_answered_in_the_inbox(taskdesk: ToolRunner) -> None:
    run = taskdesk.run(nap, {"hours": 0}, answers={"go": {"ok": True}})
    assert run.text == "accept"
    assert run.task.input_requests.get().answered_by_user == taskdesk.operator()


def test_a_client_without_elicitation_is_not_asked(taskdesk: ToolRunner) -> None:
    run = taskdesk.run(order, {"item": "lamp"}, elicitation=())
    assert run.status == "failed" and run.error is not None
    assert run.error["code"] == -32021
    assert "the client declared no elicitation capability (form mode)" in run.error["message"]
    assert run.effects == []
    answered = taskdesk.run(order, {"item": "lamp"}, elicitation=["form"], answers={"ok": {}})
    assert answered.structured == {"bought": False}


def test_a_cancelled_run_ends_cancelled(taskdesk: ToolRunner) -> None:
    run = taskdesk.run(order, {"item": "lamp"})
    taskdesk.cancel(run)
    assert run.status == "cancelled" and run.effects == []


def test_an_enabled_tool_runs_by_name(taskdesk: ToolRunner) -> None:
    run = taskdesk.run(
        "confirm_action", {"action": "deploy"}, answers={"confirm": {"confirm": True}}
    )
    assert run.text == "Confirmed: deploy"
    with pytest.raises(LookupError, match="not enabled"):
        taskdesk.run("no_such_tool")
