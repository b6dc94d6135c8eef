"""/api/tasks/: the list with /tasks/' filters and keyset, a task, cancel and settle; roles
and tenants as on the pages."""

from __future__ import annotations

import pytest

from tasks_app import listing
from tasks_app.api.tasks import TaskRecordSerializer
from tasks_app.models import AuditEntry, Effect, EffectState, Status, Task, TaskEvent
from tests.tasks_app.test_bulk import make


@pytest.fixture
def task(alice):  # type: ignore[no-untyped-def]
    """A working task of alice's (tenant acme) that a worker is running (it holds a lease)."""
    return Task.objects.create(
        client=alice, tool_name="slow_echo", arguments={"text": "hi"}, lease_owner="w:1:a"
    )


@pytest.fixture
def unknown(task):  # type: ignore[no-untyped-def]
    Task.objects.filter(pk=task.pk).update(lease_owner="")
    return Effect.objects.create(
        task=task, seq=1, name="send_notice", target="ops@example.com",
        downstream_key=f"{task.pk}:send_notice:1", state=EffectState.UNKNOWN,
    )  # fmt: skip


# --- reading -----------------------------------------------------------------------------------


def test_the_list_rows_are_the_exports_rows(as_viewer, alice, task) -> None:
    [row] = as_viewer.get("/api/tasks/").json()["results"]
    expected = listing.task_record(Task.objects.select_related("client").get(pk=task.pk))
    assert row == {**expected, "url": f"http://testserver/api/tasks/{task.pk}/"}
    assert set(TaskRecordSerializer().fields) == {*listing.RECORD_COLUMNS, "url"}


def test_the_list_filters_as_the_page_does(as_viewer, alice) -> None:
    make(alice, 2)
    make(alice, 1, status=Status.COMPLETED)
    make(alice, 1, tool_name="export_report")

    rows = as_viewer.get("/api/tasks/", {"status": "working", "tool": "slow_echo"}).json()
    assert len(rows["results"]) == 2
    assert {r["status"] for r in rows["results"]} == {"working"}


def test_a_bad_filter_is_400_with_the_pages_messages(as_viewer) -> None:
    response = as_viewer.get("/api/tasks/", {"status": "done", "from": "yesterday"})
    assert response.status_code == 400
    assert response.json() == {"filters": [
        "Unknown status “done”: choose one of working, input_required, completed, failed, "
        "cancelled.",
        "“yesterday” is not a date (YYYY-MM-DD) or date-time for “from”.",
    ]}  # fmt: skip


def test_the_list_pages_by_cursor_with_next_and_previous_links(as_viewer, alice) -> None:
    ids = [t.pk for t in make(alice, 5)]
    first = as_viewer.get("/api/tasks/", {"page_size": 2}).json()
    assert first["previous"] is None and first["next"].startswith("http://testserver/api/")
    second = as_viewer.get(first["next"]).json()
    third = as_viewer.get(second["next"]).json()
    assert third["next"] is None
    seen = [r["id"] for page in (first, second, third) for r in page["results"]]
    assert sorted(seen) == sorted(ids) and len(seen) == 5
    back = as_viewer.get(second["previous"]).json()
    assert back["results"] == first["results"] and back["previous"] is None


def test_another_tenants_tasks_are_never_listed_or_shown(as_operator, bob) -> None:
    [theirs] = make(bob, 1)
    assert as_operator.get("/api/tasks/").json()["results"] == []
    assert as_operator.get("/api/tasks/", {"tenant": "globex"}).json()["results"] == []
    missing = as_operator.get(f"/api/tasks/{theirs.pk}/")
    assert missing.status_code == 404 and missing.json() == {"detail": "No such task."}
    assert as_operator.get("/api/tasks/no-such-task/").json() == {"detail": "No such task."}


def test_a_task_shows_its_arguments_and_effects(as_viewer, unknown, task) -> None:
    shown = as_viewer.get(f"/api/tasks/{task.pk}/").json()
    assert shown["arguments"] == {"text": "hi"} and shown["result"] is None
    assert shown["page"] == f"http://testserver/tasks/{task.pk}/"
    assert shown["effects"] == [{
        "seq": 1, "name": "send_notice", "target": "ops@example.com", "state": "unknown",
        "compensable": False, "settled_at": None, "reconciled": None,
    }]  # fmt: skip


# --- cancel ------------------------------------------------------------------------------------


def test_an_operator_cancels_with_one_audit_entry(as_operator, task) -> None:
    response = as_operator.post(f"/api/tasks/{task.pk}/cancel/")

    assert response.status_code == 200
    assert response.json()["cancel_requested_at"] is not None
    event = TaskEvent.objects.get(task=task, kind="cancel_requested")
    assert (event.actor_type, event.actor) == ("operator", "olga")
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.actor, entry.target, entry.outcome) == (
        "task.cancel", "olga", f"task:{task.pk}", "done")  # fmt: skip
    assert entry.tenant_id == task.client.tenant_id and entry.detail == {"via": "api"}


def test_a_viewer_may_not_cancel(as_viewer, task) -> None:
    response = as_viewer.post(f"/api/tasks/{task.pk}/cancel/")
    assert response.status_code == 403
    assert response.json() == {"detail": "Your role does not allow cancelling tasks."}
    task.refresh_from_db()
    assert task.cancel_requested_at is None and not AuditEntry.objects.exists()


def test_another_tenants_task_cannot_be_cancelled(as_operator, bob) -> None:
    [theirs] = make(bob, 1)
    assert as_operator.post(f"/api/tasks/{theirs.pk}/cancel/").status_code == 404
    assert Task.objects.get(pk=theirs.pk).cancel_requested_at is None


def test_an_ended_task_is_409_and_the_refusal_is_audited(as_operator, alice) -> None:
    [ended] = make(alice, 1, status=Status.COMPLETED)
    response = as_operator.post(f"/api/tasks/{ended.pk}/cancel/")
    assert response.status_code == 409
    assert response.json() == {"detail": "The task has already ended (completed). Nothing changed."}
    entry = AuditEntry.objects.get()
    assert (entry.outcome, entry.detail["reason"]) == ("refused",
                                                       "The task has already ended (completed).")  # fmt: skip


# --- settle ------------------------------------------------------------------------------------


def test_an_operator_settles_an_unknown_effect(as_operator, unknown, task) -> None:
    body = {"happened": False, "note": "Not in the provider's log."}
    response = as_operator.post(f"/api/tasks/{task.pk}/effects/1/settle/", body)

    assert response.status_code == 200
    [effect] = response.json()["effects"]
    assert effect["reconciled"]["by"] == "olga" and effect["reconciled"]["happened"] is False
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.target) == ("effect.settle", f"effect:{unknown.pk}")
    assert entry.detail["note"] == "Not in the provider's log." and entry.detail["via"] == "api"


def test_settling_needs_a_note_and_a_decision(as_operator, unknown, task) -> None:
    response = as_operator.post(f"/api/tasks/{task.pk}/effects/1/settle/", {"note": "  "})
    assert response.status_code == 400
    assert response.json() == {
        "happened": ["This field is required."],
        "note": ["A note is required: write what you checked and what you found."],
    }
    assert not AuditEntry.objects.exists()


def test_a_viewer_may_not_settle_and_a_wrong_effect_is_404(as_viewer, as_operator, unknown,
                                                            task) -> None:  # fmt: skip
    url = f"/api/tasks/{task.pk}/effects/1/settle/"
    body = {"happened": True, "note": "checked"}
    assert as_viewer.post(url, body).status_code == 403
    assert as_operator.post(f"/api/tasks/{task.pk}/effects/2/settle/", body).status_code == 404
    assert Effect.objects.get().state == EffectState.UNKNOWN


def test_a_settled_effect_is_409_and_the_refusal_is_audited(as_operator, unknown, task) -> None:
    url = f"/api/tasks/{task.pk}/effects/1/settle/"
    assert as_operator.post(url, {"happened": True, "note": "seen"}).status_code == 200
    again = as_operator.post(url, {"happened": False, "note": "not seen"})
    assert again.status_code == 409
    assert again.json() == {"detail": "Effect 'send_notice' is confirmed; only an unknown effect "
                                      "can be reconciled. Nothing changed."}  # fmt: skip
    assert list(AuditEntry.objects.order_by("pk").values_list("outcome", flat=True)) == [
        "done", "refused"]  # fmt: skip
