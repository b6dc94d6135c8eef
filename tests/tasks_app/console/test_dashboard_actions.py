"""The task page's actions: request cancellation and reconcile an unknown effect.

The role and the tenant are checked by the selectors the views call, not only by the
template: a viewer gets no button and a direct POST is refused (403); another tenant's task is
not found (404).
"""

from __future__ import annotations

import pytest

from elicitations import transitions as questions
from tasks_app import transitions
from tasks_app.models import Effect, EffectState, Status, Task, TaskEvent


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


def kinds(task: Task) -> list[str]:
    return list(TaskEvent.objects.filter(task=task).values_list("kind", flat=True))


# --- cancellation -----------------------------------------------------------------------------


def test_an_operator_sees_the_button_and_the_confirmation(client, operator, task) -> None:
    client.force_login(operator)
    html = client.get(f"/tasks/{task.pk}/").content.decode()
    assert ">Request cancellation</button>" in html
    confirm = client.get(f"/tasks/{task.pk}/cancel/").content.decode()
    assert ">Confirm cancellation</button>" in confirm
    assert 'name="csrfmiddlewaretoken"' in confirm
    fragment = client.get(f"/tasks/{task.pk}/cancel/", HTTP_HX_REQUEST="true").content.decode()
    assert fragment.lstrip().startswith('<div class="confirm"') and "<nav" not in fragment


def test_confirming_requests_cancellation_as_the_operator(client, operator, task) -> None:
    client.force_login(operator)
    response = client.post(f"/tasks/{task.pk}/cancel/", follow=True)

    task.refresh_from_db()
    assert task.cancel_requested_at is not None
    assert task.status == Status.WORKING  # the leg stops at its next checkpoint
    event = TaskEvent.objects.get(task=task, kind="cancel_requested")
    assert (event.actor_type, event.actor) == ("operator", "olga")
    html = response.content.decode()
    assert "Cancellation requested by olga at" in html
    assert ">Request cancellation</button>" not in html


def test_a_task_waiting_for_input_is_cancelled_at_once(client, operator, task) -> None:
    Task.objects.filter(pk=task.pk).update(lease_owner="")
    questions.open_request(task=task, ask_key="q", message="Which?", audience="client")
    transitions.require_input(task_id=task.pk, message="Which?")
    client.force_login(operator)

    html = client.post(f"/tasks/{task.pk}/cancel/", HTTP_HX_REQUEST="true").content.decode()

    assert Task.objects.get(pk=task.pk).status == Status.CANCELLED
    assert 'id="task-status">Cancelled</span>' in html
    assert html.lstrip().startswith('<div id="task-body"')


def test_a_viewer_gets_no_button_and_a_direct_post_is_refused(client, viewer, task) -> None:
    client.force_login(viewer)
    assert "Request cancellation" not in client.get(f"/tasks/{task.pk}/").content.decode()
    assert client.get(f"/tasks/{task.pk}/cancel/").status_code == 403
    assert client.post(f"/tasks/{task.pk}/cancel/").status_code == 403
    task.refresh_from_db()
    assert task.cancel_requested_at is None and kinds(task) == []


def test_another_tenants_operator_gets_404(client, bob, django_user_model) -> None:
    from tasks_app.operators import grant_role

    theirs = Task.objects.create(client=bob, tool_name="slow_echo", arguments={})
    olga = django_user_model.objects.create_user(username="gus", password="pw-gus-12345")
    grant_role(olga, "operator")
    from tasks_app.models import Tenant

    Tenant.objects.get_or_create(slug="acme")[0].members.add(olga)
    client.force_login(olga)
    assert client.post(f"/tasks/{theirs.pk}/cancel/").status_code == 404
    assert client.get(f"/tasks/{theirs.pk}/").status_code == 404
    assert Task.objects.get(pk=theirs.pk).cancel_requested_at is None


def test_a_finished_task_gets_no_button_and_a_post_changes_nothing(client, operator, task) -> None:
    Task.objects.filter(pk=task.pk).update(lease_owner="")
    transitions.complete(task_id=task.pk, result={"content": []})
    before = kinds(task)
    client.force_login(operator)

    assert "Request cancellation" not in client.get(f"/tasks/{task.pk}/").content.decode()
    response = client.post(f"/tasks/{task.pk}/cancel/")

    assert response.status_code == 409
    assert "The task has already ended (completed). Nothing changed." in response.content.decode()
    assert kinds(task) == before
    assert Task.objects.get(pk=task.pk).cancel_requested_at is None


def test_a_superuser_may_cancel_in_any_tenant(client, bob, django_user_model) -> None:
    theirs = Task.objects.create(client=bob, tool_name="slow_echo", arguments={}, lease_owner="w")
    client.force_login(django_user_model.objects.create_superuser("root", password="pw-root-1"))
    assert client.post(f"/tasks/{theirs.pk}/cancel/").status_code == 302
    assert Task.objects.get(pk=theirs.pk).cancel_requested_at is not None


# --- reconciliation ---------------------------------------------------------------------------


def reconcile_url(effect: Effect) -> str:
    return f"/tasks/{effect.task_id}/effects/{effect.pk}/reconcile/"


def test_an_unknown_effect_offers_both_answers_with_a_required_note(
    client, operator, unknown
) -> None:
    client.force_login(operator)
    html = client.get(f"/tasks/{unknown.task_id}/").content.decode()
    assert f'id="effect-{unknown.pk}-state">unknown</span>' in html
    assert (
        f'<label for="note-{unknown.pk}">Note <span class="required">(required)</span></label>'
        in html
    )
    assert ">It happened</button>" in html and ">It did not happen</button>" in html
    assert f'action="/tasks/{unknown.task_id}/effects/{unknown.pk}/reconcile/"' in html
    assert "once recorded, it cannot be undone" in html


def test_choosing_asks_for_confirmation_and_records_nothing(client, operator, unknown) -> None:
    client.force_login(operator)
    for happened, consequence in (
        ("yes", "goes on without running it again"),
        ("no", "The next leg runs it again with the same key"),
    ):
        response = client.post(reconcile_url(unknown), {"happened": happened, "note": "Seen."})

        html = response.content.decode()
        assert response.status_code == 200
        assert "This cannot be undone." in html
        assert consequence in html
        assert "Your note: “Seen.”" in html
        assert '<input type="hidden" name="note" value="Seen.">' in html
        assert f'<input type="hidden" name="happened" value="{happened}">' in html
        assert 'name="confirm" value="yes"' in html and 'name="confirm" value="no"' in html
    unknown.refresh_from_db()
    assert unknown.state == EffectState.UNKNOWN and "reconciled" not in unknown.detail
    assert "effect_reconciled" not in kinds(unknown.task)


def test_the_confirmation_comes_in_place_of_the_form_over_htmx(client, operator, unknown) -> None:
    client.force_login(operator)
    hx = client.post(
        reconcile_url(unknown), {"happened": "yes", "note": "Seen."}, HTTP_HX_REQUEST="true"
    )
    assert hx.status_code == 200
    assert hx["HX-Retarget"] == f"#reconcile-{unknown.pk}"
    assert hx["HX-Reswap"] == "outerHTML"
    html = hx.content.decode()
    assert f'<form id="reconcile-{unknown.pk}"' in html and "<html" not in html
    assert 'Record that <span class="mono">send_notice</span> happened?' in html
    assert "hx-preserve" not in html  # it replaces the form, which had it


def test_go_back_returns_to_the_form_with_the_note(client, operator, unknown) -> None:
    client.force_login(operator)
    data = {"happened": "no", "note": "Bounced?", "confirm": "no"}
    hx = client.post(reconcile_url(unknown), data, HTTP_HX_REQUEST="true")
    assert hx.status_code == 200 and hx["HX-Retarget"] == f"#reconcile-{unknown.pk}"
    assert ">Bounced?</textarea>" in hx.content.decode()
    plain = client.post(reconcile_url(unknown), data)
    assert plain.status_code == 200 and ">Bounced?</textarea>" in plain.content.decode()
    unknown.refresh_from_db()
    assert "reconciled" not in unknown.detail


def test_it_happened_confirms_the_effect_and_records_who_and_the_note(
    client, operator, unknown, django_capture_on_commit_callbacks
) -> None:
    client.force_login(operator)
    with django_capture_on_commit_callbacks():
        response = client.post(
            reconcile_url(unknown),
            {"happened": "yes", "note": "Seen in the outbox log.", "confirm": "yes"},
        )

    assert response.status_code == 302
    unknown.refresh_from_db()
    assert unknown.state == EffectState.CONFIRMED
    assert unknown.detail["reconciled"]["by"] == "olga"
    assert unknown.detail["reconciled"]["note"] == "Seen in the outbox log."
    event = TaskEvent.objects.get(task_id=unknown.task_id, kind="effect_reconciled")
    assert (event.actor_type, event.actor) == ("operator", "olga")
    assert event.detail["note"] == "Seen in the outbox log." and event.detail["happened"] is True
    assert "resumed" in kinds(unknown.task)  # the waiting task goes on
    html = client.get(f"/tasks/{unknown.task_id}/").content.decode()
    assert "send_notice happened: “Seen in the outbox log.”" in html


def test_it_did_not_happen_leaves_it_for_the_next_leg(client, operator, unknown) -> None:
    client.force_login(operator)
    html = client.post(
        reconcile_url(unknown),
        {"happened": "no", "note": "Bounced.", "confirm": "yes"},
        HTTP_HX_REQUEST="true",
    ).content.decode()
    unknown.refresh_from_db()
    assert unknown.state == EffectState.UNKNOWN
    assert unknown.detail["reconciled"]["happened"] is False
    assert "olga said it did not happen (“Bounced.”)" in html
    assert f'id="reconcile-{unknown.pk}"' not in html


def test_a_decision_cannot_be_changed_while_the_next_leg_acts_on_it(
    client, operator, unknown
) -> None:
    client.force_login(operator)
    first = {"happened": "no", "note": "Bounced.", "confirm": "yes"}
    assert client.post(reconcile_url(unknown), first).status_code == 302

    for data in (
        {"happened": "yes", "note": "It went out after all."},
        {"happened": "yes", "note": "It went out after all.", "confirm": "yes"},
    ):
        response = client.post(reconcile_url(unknown), data)
        assert response.status_code == 409
        assert "olga already said &#x27;send_notice&#x27; did not happen." in (
            response.content.decode()
        )
    unknown.refresh_from_db()
    assert unknown.state == EffectState.UNKNOWN
    assert unknown.detail["reconciled"]["note"] == "Bounced."
    assert kinds(unknown.task).count("effect_reconciled") == 1


@pytest.mark.parametrize("confirm", ["", "yes"])
def test_a_note_is_required_by_the_server(client, operator, unknown, confirm) -> None:
    client.force_login(operator)
    message = "A note is required: write what you checked and what you found."
    for note in ("", "  "):
        response = client.post(
            reconcile_url(unknown), {"happened": "yes", "note": note, "confirm": confirm}
        )
        assert response.status_code == 400
        assert message in response.content.decode()
    assert client.post(reconcile_url(unknown), {"happened": "yes"}).status_code == 400
    hx = client.post(
        reconcile_url(unknown),
        {"happened": "yes", "note": "", "confirm": confirm},
        HTTP_HX_REQUEST="true",
    )
    assert hx.status_code == 400
    assert hx["HX-Retarget"] == f"#reconcile-{unknown.pk}"
    html = hx.content.decode()
    assert message in html and 'aria-invalid="true"' in html
    assert "hx-preserve" not in html
    unknown.refresh_from_db()
    assert unknown.state == EffectState.UNKNOWN and "reconciled" not in unknown.detail


def test_a_choice_is_required_by_the_server(client, operator, unknown) -> None:
    client.force_login(operator)
    response = client.post(reconcile_url(unknown), {"note": "x", "confirm": "yes"})
    assert response.status_code == 400
    assert "Choose It happened or It did not happen." in response.content.decode()
    unknown.refresh_from_db()
    assert "reconciled" not in unknown.detail


def test_a_viewer_may_not_reconcile(client, viewer, unknown) -> None:
    client.force_login(viewer)
    html = client.get(f"/tasks/{unknown.task_id}/").content.decode()
    assert "It happened" not in html and "an operator must reconcile it" in html
    url = f"/tasks/{unknown.task_id}/effects/{unknown.pk}/reconcile/"
    assert client.post(url, {"happened": "yes", "note": "x", "confirm": "yes"}).status_code == 403
    unknown.refresh_from_db()
    assert unknown.state == EffectState.UNKNOWN


def test_an_effect_of_another_task_or_tenant_is_not_found(client, operator, unknown, bob) -> None:
    theirs = Task.objects.create(client=bob, tool_name="send_notice", arguments={})
    effect = Effect.objects.create(
        task=theirs, seq=1, name="send_notice", downstream_key="theirs:1", state="unknown"
    )
    mine = Task.objects.create(client=unknown.task.client, tool_name="x", arguments={})
    client.force_login(operator)
    data = {"happened": "yes", "note": "x", "confirm": "yes"}
    assert (
        client.post(f"/tasks/{theirs.pk}/effects/{effect.pk}/reconcile/", data).status_code == 404
    )
    assert client.post(f"/tasks/{mine.pk}/effects/{effect.pk}/reconcile/", data).status_code == 404
    assert client.post(f"/tasks/{mine.pk}/effects/{unknown.pk}/reconcile/", data).status_code == 404
    effect.refresh_from_db()
    assert effect.state == "unknown"


def test_a_settled_effect_cannot_be_reconciled(client, operator, unknown) -> None:
    Effect.objects.filter(pk=unknown.pk).update(state=EffectState.CONFIRMED)
    client.force_login(operator)
    url = f"/tasks/{unknown.task_id}/effects/{unknown.pk}/reconcile/"
    response = client.post(url, {"happened": "no", "note": "x", "confirm": "yes"})
    assert response.status_code == 409
    assert "only an unknown effect can be reconciled" in response.content.decode()
    assert "effect_reconciled" not in kinds(unknown.task)


# --- the rest of the page ---------------------------------------------------------------------


def test_the_journal_is_collapsed_and_cut_to_a_readable_length(client, operator, task) -> None:
    from tasks_app.models import JournalEntry

    JournalEntry.objects.create(task=task, seq=1, kind="step", name="fetch", outcome="x" * 5000)
    client.force_login(operator)
    html = client.get(f"/tasks/{task.pk}/").content.decode()
    assert '<details id="journal" class="journal">' in html
    assert "x" * 290 in html and "x" * 400 not in html and "(cut)" in html


def test_the_timeline_pages_past_200_events(client, operator, task) -> None:
    TaskEvent.objects.bulk_create(
        [TaskEvent(task=task, kind=f"step_{i:03d}", actor_type="worker") for i in range(250)]
    )
    client.force_login(operator)
    html = client.get(f"/tasks/{task.pk}/").content.decode()
    assert html.count("<strong>step_") == 200
    assert "<strong>step_249</strong>" in html and "<strong>step_049</strong>" not in html
    earlier = html.split('id="events-earlier" href="')[1].split('"')[0].replace("&amp;", "&")
    older = client.get(earlier).content.decode()
    assert older.count("<strong>step_") == 50 and "<strong>step_000</strong>" in older
    assert 'id="events-latest"' in older


def test_the_page_refresh_answers_204_until_something_changes(client, operator, task) -> None:
    client.force_login(operator)
    html = client.get(f"/tasks/{task.pk}/").content.decode()
    poll = html.split('hx-get="', 1)[1].split('"')[0].replace("&amp;", "&")
    assert client.get(poll, HTTP_HX_REQUEST="true").status_code == 204
    Task.objects.filter(pk=task.pk).update(lease_owner="")
    transitions.complete(task_id=task.pk, result={"content": []})
    response = client.get(poll, HTTP_HX_REQUEST="true")
    assert (
        response.status_code == 200
        and 'id="task-status">Completed</span>' in response.content.decode()
    )


def test_a_viewer_sees_questions_but_cannot_answer(client, viewer, task) -> None:
    Task.objects.filter(pk=task.pk).update(lease_owner="")
    request = questions.open_request(
        task=task, ask_key="ok", message="Go ahead?", audience="operator",
        schema={"type": "object", "properties": {"ok": {"type": "boolean", "title": "OK"}}},
    )  # fmt: skip
    client.force_login(viewer)
    assert "Go ahead?" in client.get("/inbox/").content.decode()
    page = client.get(f"/inbox/{request.pk}/").content.decode()
    assert "Your role lets you see this question, not answer it." in page
    assert ">Accept</button>" not in page
    response = client.post(f"/inbox/{request.pk}/", {"_action": "accept", "ok": "on"})
    assert response.status_code == 403
    request.refresh_from_db()
    assert request.status == "pending"


def test_the_answer_transition_refuses_a_viewer_too(viewer, task) -> None:
    Task.objects.filter(pk=task.pk).update(lease_owner="")
    request = questions.open_request(task=task, ask_key="ok", message="Go?", audience="operator")
    outcome = questions.answer(task=task, key=request.key, response={"action": "decline"},
                               channel="inbox", user=viewer)  # fmt: skip
    assert outcome.errors == ("the operator's role may not answer questions",)
    request.refresh_from_db()
    assert request.status == "pending"
    refused = TaskEvent.objects.get(task=task, kind="input_answer_refused")
    assert refused.detail["reason"] == "the operator's role may not answer questions"
