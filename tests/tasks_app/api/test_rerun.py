"""POST /api/tasks/<id>/rerun/ and a bulk "rerun": the same code as the task page's Run again."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks_app.models import AuditEntry, Effect, Task
from tasks_app.tools.toolsets.demo.models import DemoRefund
from tests.runtime_toolset import RUNTIME_TOOLSETS
from tests.tasks_app.runtime.helpers import leg, refund_whose_receipt_failed


@pytest.fixture(autouse=True)
def _runtime_tools(settings):  # type: ignore[no-untyped-def]
    settings.TASKDESK_TOOLSETS = RUNTIME_TOOLSETS


@pytest.fixture
def failed(alice, tmp_path: Path):  # type: ignore[no-untyped-def]
    return refund_whose_receipt_failed(alice, tmp_path, "pay_3")


def test_get_says_what_it_would_do_and_post_runs_it_again_once(as_operator, failed) -> None:
    plan = as_operator.get(f"/api/tasks/{failed.pk}/rerun/")
    assert plan.status_code == 200
    assert plan.json() == {
        "key": f"{failed.pk}~rerun-1", "reuse_by_default": True, "reusable": 1,
        "replayed": ["refund"], "applied": ["refund"], "effects": {"confirmed": ["refund"]},
        "blocked": "",
    }  # fmt: skip

    first = as_operator.post(f"/api/tasks/{failed.pk}/rerun/", {"key": plan.json()["key"]})
    again = as_operator.post(f"/api/tasks/{failed.pk}/rerun/", {"key": plan.json()["key"]})

    assert first.status_code == 201 and again.json()["id"] == first.json()["id"]
    new = Task.objects.get(rerun_of=failed)
    assert leg(new).value == "completed"
    assert DemoRefund.objects.count() == 1
    assert Effect.objects.get(task=new).detail["reused"]["task"] == failed.pk
    assert AuditEntry.objects.filter(action="task.rerun").count() == 1


def test_a_viewer_is_refused_and_an_unsettled_effect_blocks_it(
    as_viewer, as_operator, failed
) -> None:
    assert as_viewer.post(f"/api/tasks/{failed.pk}/rerun/", {}).status_code == 403
    Effect.objects.filter(task=failed).update(state="unknown")
    refused = as_operator.post(f"/api/tasks/{failed.pk}/rerun/", {})
    assert refused.status_code == 409 and "settle it" in refused.json()["detail"]
    assert not Task.objects.filter(rerun_of=failed).exists()


def test_run_all_matching_again_through_the_api(as_operator, run_jobs, failed) -> None:
    body = {"kind": "rerun", "filters": {"outcome": "tool_error"}, "reuse": True}
    dry = as_operator.post("/api/bulk/", body)
    assert dry.status_code == 200 and dry.json()["act"] == 1

    with run_jobs():
        started = as_operator.post("/api/bulk/", {**body, "dry_run": False, "expected": 1})

    assert started.status_code == 201
    new = Task.objects.get(rerun_of=failed)
    assert new.idempotency_key == f"{failed.pk}~bulk-{started.json()['id']}"
    assert AuditEntry.objects.filter(action="bulk.rerun").count() == 1
