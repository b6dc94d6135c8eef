"""The demo toolset, run as tasks in-process: exports, refunds, confirmations, echoes."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest
from django.utils import timezone

from elicitations import transitions as elicitations
from elicitations.models import Channel
from tasks_app import runtime
from tasks_app.models import Effect, Status, Task
from tasks_app.runtime import LegOutcome
from tasks_app.testing import Killed as Died
from tasks_app.testing import after_death
from tasks_app.tools import get_tool
from tasks_app.tools.toolsets.demo import tools as demo
from tasks_app.tools.toolsets.demo.models import DemoRefund
from tests.tasks_app.runtime.helpers import answer, events, leg, next_dispatch, pending, submit
from tests.tasks_app.runtime.helpers import text_of as text


@pytest.fixture(autouse=True)
def _demo_settings(settings, tmp_path):  # type: ignore[no-untyped-def]
    settings.TASKDESK_EXPORT_DIR = tmp_path / "exports"
    settings.TASKDESK_DEMO_EXPORT_SECONDS = 0.05
    settings.TASKDESK_REFUND_APPROVAL_CENTS = 10000


def writes(settings) -> list[dict[str, str]]:  # type: ignore[no-untyped-def]
    log = Path(settings.TASKDESK_EXPORT_DIR) / demo.WRITE_LOG
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def die_once(monkeypatch, target: object, name: str) -> None:  # type: ignore[no-untyped-def]
    """Make TARGET.NAME kill the "process" the first time it is called."""
    original = getattr(target, name)

    def dying(*args, **kwargs):  # type: ignore[no-untyped-def]
        monkeypatch.setattr(target, name, original)
        raise Died()

    monkeypatch.setattr(target, name, dying)


def run_dying_leg(task: Task) -> None:
    with pytest.raises(Died):
        runtime.run_leg(task_id=task.pk, dispatch_id=next_dispatch(task))


# --- the tools as clients see them --------------------------------------------------------


def test_the_demo_tools_declare_their_task_policy_keys_and_schemas() -> None:
    export, refund = get_tool("export_report"), get_tool("refund_payment")
    confirm, echo = get_tool("confirm_action"), get_tool("slow_echo")
    assert export and refund and confirm and echo
    assert (export.task, export.requires_idempotency_key) == ("required", True)
    assert (refund.task, refund.requires_idempotency_key, refund.key_argument) == (
        "required",
        True,
        "request_key",
    )
    assert (confirm.task, echo.task) == ("required", "optional")
    assert export.input_schema["properties"]["quarter"]["enum"] == ["Q1", "Q2", "Q3", "Q4"]
    assert export.input_schema["properties"]["format"]["default"] == "csv"
    assert export.input_schema["properties"]["rows"]["default"] == 1000
    assert refund.input_schema["properties"]["amount_cents"]["minimum"] == 1
    assert set(export.output_schema["required"]) == {"file", "format", "rows", "sha256"}
    assert confirm.output_schema["properties"]["confirmed"]["type"] == "boolean"
    assert echo.input_schema["properties"]["seconds"] == {
        "default": 5,
        "description": "How long to wait",
        "maximum": 3600,
        "minimum": 0,
        "type": "number",
    }
    assert refund.annotations["destructiveHint"] is True


# --- export_report ---------------------------------------------------------------------------


def test_an_export_writes_its_file_once_and_returns_its_checksum(alice, settings) -> None:
    task = submit(alice, "export_report", quarter="Q2", rows=25)

    assert leg(task) == LegOutcome.COMPLETED

    path = Path(settings.TASKDESK_EXPORT_DIR) / f"{task.pk}.csv"
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    assert task.result["structuredContent"] == {
        "file": f"{task.pk}.csv",
        "format": "csv",
        "rows": 25,
        "sha256": digest,
    }
    assert text(task.result) == (
        f"Exported 25 rows of Q2 as csv to the file {task.pk}.csv (sha256 {digest})."
    )
    # The client learns the file's name, never where the server keeps it.
    assert str(settings.TASKDESK_EXPORT_DIR) not in json.dumps(task.result)
    lines = data.decode().splitlines()
    assert lines[0] == "quarter,row,region,amount_cents"
    assert len(lines) == 26
    assert lines[1].startswith("Q2,1,")
    effect = Effect.objects.get(task=task)
    assert (effect.name, effect.state, effect.target) == ("write_export", "confirmed", str(path))
    assert effect.detail == {"path": str(path), "sha256": digest}
    assert [w["task"] for w in writes(settings)] == [task.pk]
    assert sorted(p.name for p in path.parent.iterdir()) == sorted([path.name, demo.WRITE_LOG])


def test_a_json_export_is_an_array_of_rows(alice, settings) -> None:
    task = submit(alice, "export_report", quarter="Q4", format="json", rows=7)

    leg(task)

    name = task.result["structuredContent"]["file"]
    rows = json.loads((Path(settings.TASKDESK_EXPORT_DIR) / name).read_text())
    assert len(rows) == 7
    assert rows[6]["row"] == 7
    assert set(rows[0]) == {"quarter", "row", "region", "amount_cents"}


def test_the_partial_file_of_a_dead_leg_is_removed_and_never_counts(
    alice, settings, monkeypatch
) -> None:
    task = submit(alice, "export_report", quarter="Q1", rows=40)
    die_once(monkeypatch, demo.os, "replace")  # dies with the data written, before the rename
    run_dying_leg(task)
    folder = Path(settings.TASKDESK_EXPORT_DIR)
    [partial] = folder.glob(f".{task.pk}.csv.*.part")
    assert not (folder / f"{task.pk}.csv").exists()

    assert after_death(task) == LegOutcome.COMPLETED

    assert not partial.exists()
    assert (folder / f"{task.pk}.csv").exists()
    assert len(writes(settings)) == 1
    assert events(task)[-5:] == [
        "leg_started",
        "effect_unknown",
        "effect_retried",
        "effect_confirmed",
        "completed",
    ]


def test_an_export_renamed_just_before_the_worker_died_is_verified_not_rewritten(
    alice, settings, monkeypatch
) -> None:
    task = submit(alice, "export_report", quarter="Q3", rows=10)
    die_once(monkeypatch, demo, "_log_write")  # the file is in place; the outcome is not
    run_dying_leg(task)
    path = Path(settings.TASKDESK_EXPORT_DIR) / f"{task.pk}.csv"
    inode = path.stat().st_ino

    assert after_death(task) == LegOutcome.COMPLETED

    assert path.stat().st_ino == inode  # the same file: not written again
    assert Effect.objects.get(task=task).detail == {"verified": True}
    assert (
        task.result["structuredContent"]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    )


def test_an_export_cancelled_while_generating_writes_nothing(alice, settings) -> None:
    task = submit(alice, "export_report", quarter="Q1")
    Task.objects.filter(pk=task.pk).update(cancel_requested_at=timezone.now())

    assert leg(task) == LegOutcome.CANCELLED

    assert not Effect.objects.filter(task=task).exists()
    assert writes(settings) == []


# --- refund_payment --------------------------------------------------------------------------


def test_a_small_refund_is_made_once_without_approval(alice) -> None:
    task = submit(alice, "refund_payment", payment_id="pay_1", amount_cents=2500, reason="late")

    assert leg(task) == LegOutcome.COMPLETED

    refund = DemoRefund.objects.get()
    assert refund.downstream_key == f"{task.pk}:refund:0"
    assert (refund.payment_id, refund.amount_cents, refund.reason) == ("pay_1", 2500, "late")
    refund_id = f"rf_{refund.pk:08d}"
    assert task.result["structuredContent"] == {
        "refund_id": refund_id,
        "payment_id": "pay_1",
        "amount_cents": 2500,
    }
    assert text(task.result) == f"Refunded 25.00 on payment pay_1: refund {refund_id}."
    assert Effect.objects.get(task=task).detail == {"refund_id": refund_id}


def test_a_large_refund_waits_for_an_operator_and_then_refunds(alice, operator) -> None:
    task = submit(alice, "refund_payment", payment_id="pay_2", amount_cents=20000, reason="x")

    assert leg(task) == LegOutcome.SUSPENDED
    assert task.status == Status.WORKING
    [request] = pending(task)
    assert request.audience == "operator"
    assert request.message == "Approve a refund of 200.00 on payment pay_2? Reason given: x"
    assert task.status_message.startswith("Waiting for an operator in the inbox: Approve")
    assert not DemoRefund.objects.exists()

    assert request.form_schema == demo.APPROVAL_FORM
    answer(task, "approval", {"action": "accept", "content": {"decision": "approve"}},
           channel=Channel.INBOX, user=operator)  # fmt: skip
    assert leg(task) == LegOutcome.COMPLETED
    assert DemoRefund.objects.get().amount_cents == 20000
    assert task.result["isError"] is False


def test_a_declined_refund_completes_with_an_error_and_the_reason(alice, operator) -> None:
    task = submit(alice, "refund_payment", payment_id="pay_3", amount_cents=10000, reason="x")
    leg(task)

    content = {"decision": "decline", "note": "fraud"}
    answer(task, "approval", {"action": "accept", "content": content},
           channel=Channel.INBOX, user=operator)  # fmt: skip
    leg(task)

    assert task.status == Status.COMPLETED
    assert task.result["isError"] is True
    assert text(task.result) == "Refund of pay_3 was declined by an operator: fraud"
    assert not DemoRefund.objects.exists()


def test_an_answer_without_a_decision_is_refused_and_refunds_nothing(alice, operator) -> None:
    task = submit(alice, "refund_payment", payment_id="pay_5", amount_cents=10000, reason="x")
    leg(task)

    [request] = pending(task)
    outcome = elicitations.answer(task=task, key=request.key, channel=Channel.INBOX, user=operator,
                                  response={"action": "accept", "content": {"note": "ok"}})  # fmt: skip

    assert outcome.errors == ("decision: is required",)
    assert [r.status for r in pending(task)] == ["pending"]
    assert not DemoRefund.objects.exists()


@pytest.mark.parametrize(("content", "refunded"), [
    ({"approve": True}, True), ({"approve": False, "note": "no"}, False),
])  # fmt: skip
def test_an_answer_to_the_earlier_approve_form_still_decides(
    alice, operator, content, refunded
) -> None:
    # A question asked before the upgrade keeps its schema; its answer decides as it did.
    from elicitations.models import InputRequest

    task = submit(alice, "refund_payment", payment_id="pay_6", amount_cents=10000, reason="x")
    leg(task)
    old = {"type": "object", "properties": {"approve": {"type": "boolean"}, "note": {"type": "string"}},
           "required": ["approve"]}  # fmt: skip
    InputRequest.objects.filter(task=task).update(requested_schema=old, property_order=[])
    answer(task, "approval", {"action": "accept", "content": content},
           channel=Channel.INBOX, user=operator)  # fmt: skip
    leg(task)

    assert DemoRefund.objects.exists() is refunded
    assert task.result["isError"] is not refunded


def test_a_declined_approval_also_ends_the_refund(alice, operator) -> None:
    task = submit(alice, "refund_payment", payment_id="pay_4", amount_cents=99999, reason="x")
    leg(task)

    answer(task, "approval", {"action": "decline"}, channel=Channel.INBOX, user=operator)
    leg(task)

    assert text(task.result) == (
        "Refund of pay_4 was not approved by an operator: the question was declined"
    )


def test_the_provider_refuses_a_second_refund_with_the_same_key(db) -> None:
    demo.issue_refund(key="k1", payment_id="p", amount_cents=1, reason="")

    with pytest.raises(demo.DuplicateRefund, match="a refund with key k1 already exists"):
        demo.issue_refund(key="k1", payment_id="p", amount_cents=1, reason="")
    with pytest.raises(demo.DuplicateRefund):
        demo.issue_refund(key="k1", payment_id="p", amount_cents=1, reason="")

    assert DemoRefund.objects.count() == 1
    assert DemoRefund.objects.get().refused_calls == 2  # three calls, one refund


def test_a_refund_made_just_before_the_worker_died_is_verified_not_repeated(
    alice, monkeypatch
) -> None:
    task = submit(alice, "refund_payment", payment_id="pay_5", amount_cents=100, reason="x")
    original = demo.issue_refund

    def refund_then_die(**kwargs):  # type: ignore[no-untyped-def]
        original(**kwargs)
        raise Died()

    monkeypatch.setattr(demo, "issue_refund", refund_then_die)
    run_dying_leg(task)
    monkeypatch.setattr(demo, "issue_refund", original)

    assert after_death(task) == LegOutcome.COMPLETED

    assert DemoRefund.objects.count() == 1
    assert Effect.objects.get(task=task).state == "confirmed"
    assert task.result["isError"] is False


# --- confirm_action and slow_echo -------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "confirmed", "summary"),
    [
        ({"action": "accept", "content": {"confirm": True}}, True, "Confirmed: deploy"),
        ({"action": "accept", "content": {"confirm": False}}, False, "Not confirmed: deploy"),
        ({"action": "decline"}, False, "Not confirmed (the question was declined): deploy"),
    ],
)
def test_confirm_action_asks_the_client(alice, response, confirmed, summary) -> None:
    task = submit(alice, "confirm_action", action="deploy")

    leg(task)
    assert task.status == Status.INPUT_REQUIRED
    [request] = pending(task)
    assert (request.audience, request.message) == ("client", "Confirm: deploy")
    assert request.requested_schema["properties"] == {
        "confirm": {"type": "boolean", "title": "Confirm"}
    }
    answer(task, "confirm", response)
    leg(task)

    assert task.result["structuredContent"] == {"confirmed": confirmed}
    assert text(task.result) == summary


def test_slow_echo_echoes_after_the_wait(alice) -> None:
    task = submit(alice, "slow_echo", text="hello", seconds=0.3)
    started = time.monotonic()

    leg(task)

    assert time.monotonic() - started >= 0.3
    assert task.result == {"content": [{"type": "text", "text": "hello"}], "isError": False}


def test_slow_echo_stops_within_a_checkpoint_once_cancelled(alice) -> None:
    task = submit(alice, "slow_echo", text="hello", seconds=60)
    Task.objects.filter(pk=task.pk).update(cancel_requested_at=timezone.now())
    started = time.monotonic()

    assert leg(task) == LegOutcome.CANCELLED

    assert time.monotonic() - started < 0.5


def test_the_export_folder_is_created_on_first_use(alice, settings, tmp_path) -> None:
    settings.TASKDESK_EXPORT_DIR = tmp_path / "new" / "folder"
    task = submit(alice, "export_report", quarter="Q1", rows=1)

    leg(task)

    assert os.path.isdir(settings.TASKDESK_EXPORT_DIR)
    assert task.status == Status.COMPLETED
