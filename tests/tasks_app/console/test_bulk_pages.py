"""/tasks/bulk/<kind>/: the dry run and its confirmation; /bulk/<id>/: progress and record."""

from __future__ import annotations

import re

import pytest

from tasks_app import bulk
from tasks_app.models import AuditEntry, BulkAction, Effect, EffectState, Status, Task
from tasks_app.operators import change_token, grant_role
from tests.tasks_app.test_bulk import make


@pytest.fixture
def confirm(client, monkeypatch, django_capture_on_commit_callbacks):  # type: ignore[no-untyped-def]
    """POST a confirmation. The job is queued once it commits; here it runs in the test's
    process then (a test's transaction never commits: its commit callbacks are captured)."""
    monkeypatch.setattr(bulk, "enqueue", lambda bulk_id: bulk.run(bulk_id))

    def post(url: str, data: dict[str, str]):  # type: ignore[no-untyped-def]
        with django_capture_on_commit_callbacks(execute=True):
            return client.post(url, data)

    return post


def confirm_form(html: str) -> dict[str, str]:
    return dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', html))


def test_the_list_offers_cancel_all_matching_to_an_operator_only(client, operator, viewer) -> None:
    client.force_login(operator)
    html = client.get("/tasks/?tool=slow_echo").content.decode()
    assert 'id="bulk-cancel" class="bulk-link" href="/tasks/bulk/cancel/?tool=slow_echo"' in html
    assert 'id="bulk-settle"' not in html  # only on the attention list
    assert 'id="bulk-settle"' in client.get("/tasks/?attention=1").content.decode()

    client.force_login(viewer)
    assert 'id="bulk-cancel"' not in client.get("/tasks/?tool=slow_echo").content.decode()
    assert client.get("/tasks/bulk/cancel/?tool=slow_echo").status_code == 403
    assert client.post("/tasks/bulk/cancel/?tool=slow_echo", {}).status_code == 403


def test_the_dry_run_shows_the_counts_and_the_first_rows(client, operator, alice) -> None:
    make(alice, 3)
    make(alice, 1, status=Status.COMPLETED)
    client.force_login(operator)

    html = client.get("/tasks/bulk/cancel/?tool=slow_echo").content.decode()

    assert 'id="bulk-matched">4<' in html and 'id="bulk-act">3<' in html
    assert 'id="bulk-skipped">1<' in html and 'id="bulk-refused">0<' in html
    assert html.count('id="sample-') == 4 and 'id="bulk-typed"' not in html
    assert "Cancel 3 tasks" in html


def test_over_a_hundred_tasks_the_count_must_be_typed(client, confirm, operator, alice) -> None:
    make(alice, 101)
    client.force_login(operator)
    html = client.get("/tasks/bulk/cancel/").content.decode()
    form = confirm_form(html)
    assert 'id="bulk-typed"' in html and form["expected"] == "101"

    wrong = confirm("/tasks/bulk/cancel/", {**form, "typed": "100"})
    assert wrong.status_code == 400 and "Type 101" in wrong.content.decode()
    assert not BulkAction.objects.exists()

    done = confirm("/tasks/bulk/cancel/", {**form, "typed": "101"})
    action = BulkAction.objects.get()
    assert done["Location"] == f"/bulk/{action.pk}/"
    assert Task.objects.filter(cancel_requested_at__isnull=False).count() == 101
    page = client.get(done["Location"]).content.decode()
    assert "Finished" in page and 'id="bulk-done">101<' in page
    assert page.count('data-outcome="done"') == 101
    assert AuditEntry.objects.filter(action="bulk.cancel", actor="olga").count() == 1


def test_settle_all_matching_needs_a_decision_and_a_note(client, confirm, operator, alice) -> None:
    [task] = make(alice, 1, tool_name="send_notice")
    Effect.objects.create(task=task, seq=1, name="send_notice", state=EffectState.UNKNOWN,
                          downstream_key="k-1")  # fmt: skip
    client.force_login(operator)
    url = "/tasks/bulk/settle/?outcome=unknown_effect"
    form = confirm_form(client.get(url).content.decode())

    refused = client.post(url, form)
    assert refused.status_code == 400
    assert "A note is required" in refused.content.decode()
    confirm(url, {**form, "happened": "no", "note": "Not in the provider's log."})

    effect = Effect.objects.get()
    assert effect.detail["reconciled"]["note"] == "Not in the provider's log."
    assert client.get("/tasks/bulk/settle/").status_code == 400  # not the attention list


def test_another_operator_does_not_see_the_bulk_action(
    client, operator, alice, django_user_model
) -> None:
    make(alice, 1)
    client.force_login(operator)
    form = confirm_form(client.get("/tasks/bulk/cancel/").content.decode())
    location = client.post("/tasks/bulk/cancel/", form)["Location"]

    other = django_user_model.objects.create_user("otto")
    alice.tenant.members.add(other)
    grant_role(other, "operator")
    client.force_login(other)
    assert client.get(location).status_code == 404


def test_the_progress_refresh_answers_204_while_nothing_changes(
    client, confirm, operator, alice
) -> None:
    make(alice, 2)
    client.force_login(operator)
    form = confirm_form(client.get("/tasks/bulk/cancel/").content.decode())
    location = confirm("/tasks/bulk/cancel/", form)["Location"]
    html = client.get(location, HTTP_HX_REQUEST="true").content.decode()
    assert 'id="bulk-progress"' in html and "<html" not in html
    action = BulkAction.objects.get()
    since = change_token(action.state, action.handled, action.touched_at)
    assert client.get(f"{location}?since={since}", HTTP_HX_REQUEST="true").status_code == 204


def test_a_stale_or_forged_confirmation_is_refused(client, operator, alice) -> None:
    make(alice, 1)
    client.force_login(operator)
    response = client.post("/tasks/bulk/cancel/", {"until": "yesterday", "expected": "1"})
    assert response.status_code == 400 and not BulkAction.objects.exists()


def test_each_tasks_timeline_names_the_bulk_action(client, confirm, operator, alice) -> None:
    [task] = make(alice, 1)
    client.force_login(operator)
    form = confirm_form(client.get("/tasks/bulk/cancel/").content.decode())
    confirm("/tasks/bulk/cancel/", form)
    action = BulkAction.objects.get()

    html = client.get(f"/tasks/{task.pk}/").content.decode()

    assert f'in bulk action <a href="/bulk/{action.pk}/">#{action.pk}</a>' in html
