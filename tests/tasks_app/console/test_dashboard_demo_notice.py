"""The demo send_notice tool: a notice sent once, and the operator's decision when a worker
died inside its effect (it has no verify hook)."""

from __future__ import annotations

import pytest

from tasks_app import runtime
from tasks_app.models import Effect, Status
from tasks_app.runtime import LegOutcome
from tasks_app.tools import get_tool
from tasks_app.tools.toolsets.demo import tools as demo
from tests.tasks_app.runtime.helpers import events, leg, submit
from tests.tasks_app.test_demo_tools import after_death, die_once, run_dying_leg

ARGS = {"to": "ops@example.com", "subject": "Maintenance", "body": "Tonight at 22:00."}


@pytest.fixture(autouse=True)
def _demo_settings(settings, tmp_path):  # type: ignore[no-untyped-def]
    settings.TASKDESK_EXPORT_DIR = tmp_path / "exports"
    settings.TASKDESK_DEMO_NOTICE_SECONDS = 0


def test_it_is_task_required_and_keyed() -> None:
    spec = get_tool("send_notice")
    assert spec is not None
    assert (spec.task, spec.requires_idempotency_key, spec.key_argument) == (
        "required",
        True,
        "request_key",
    )
    assert set(spec.input_schema["required"]) == {"to", "subject", "body"}


def test_a_notice_is_sent_once(alice) -> None:
    task = submit(alice, "send_notice", **ARGS)
    assert leg(task) == LegOutcome.COMPLETED
    [sent] = demo.sent_notices()
    assert (sent["to"], sent["subject"], sent["key"]) == (
        "ops@example.com",
        "Maintenance",
        f"{task.pk}:send_notice:0",
    )
    assert task.result["structuredContent"] == {"notice_id": sent["key"], "to": "ops@example.com"}


def test_a_worker_dying_inside_the_effect_leaves_it_to_an_operator(
    alice, operator, monkeypatch
) -> None:
    task = submit(alice, "send_notice", **ARGS)
    die_once(monkeypatch, demo, "_export_dir")  # inside the effect, before the notice is sent
    run_dying_leg(task)

    assert after_death(task) == LegOutcome.AWAITING_OPERATOR
    effect = Effect.objects.get(task=task)
    task.refresh_from_db()
    assert effect.state == "unknown"
    assert task.status == Status.WORKING
    assert "An operator must reconcile it" in task.status_message
    assert "effect_needs_reconciliation" in events(task)
    assert demo.sent_notices() == []

    runtime.reconcile_effect(effect_id=effect.pk, happened=True, user=operator, note="went out")
    assert leg(task) == LegOutcome.COMPLETED
    assert demo.sent_notices() == []  # confirmed by the operator: not sent a second time
    assert Effect.objects.get(task=task).state == "confirmed"
