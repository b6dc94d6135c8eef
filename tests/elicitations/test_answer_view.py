"""/inbox/<id>/: the answer form built from the schema, and what submitting it does."""

from __future__ import annotations

import json
import re

from django.test import Client

from elicitations.models import InputRequest
from tasks_app.models import Dispatch, Task, TaskEvent
from tasks_app.operators import grant_role
from tests.elicitations.test_schemas import EVERY_FIELD_KIND

HTMX = {"HTTP_HX_REQUEST": "true"}


def url(request: InputRequest) -> str:
    return f"/inbox/{request.pk}/"


def test_the_form_has_one_labelled_input_per_property_and_three_buttons(
    client, operator, ask
) -> None:
    request = ask()
    client.force_login(operator)

    html = client.get(url(request)).content.decode()

    # A required boolean without a default: Yes and No, neither chosen.
    assert '<legend>Approve the refund <span class="required">(required)</span></legend>' in html
    assert re.search(
        r'<input type="radio" name="approve" value="true" required id="id_approve_0">\s*Yes</label>',
        html,
    )
    assert re.search(
        r'<input type="radio" name="approve" value="false" required id="id_approve_1">\s*No</label>',
        html,
    )
    assert "checked" not in html
    assert '<input type="text" name="note" maxlength="200" id="id_note">' in html
    assert '<label for="id_note">Note</label>' in html
    buttons = re.findall(
        r'<button type="submit" name="_action" value="(\w+)"[^>]*>(\w+)</button>', html
    )
    assert buttons == [("accept", "Accept"), ("decline", "Decline"), ("cancel", "Cancel")]
    assert '<input type="hidden" name="csrfmiddlewaretoken"' in html


def test_every_field_kind_renders_with_its_default(client, operator, ask) -> None:
    request = ask(schema=EVERY_FIELD_KIND)
    client.force_login(operator)

    html = client.get(url(request)).content.decode()

    # One input per property, in the order the schema lists them (on PostgreSQL too).
    names = list(dict.fromkeys(re.findall(r'<(?:input|select|textarea)[^>]* name="(\w+)"', html)))
    assert names == ["csrfmiddlewaretoken", *EVERY_FIELD_KIND["properties"]]
    assert re.search(
        r'<input type="text" name="name" minlength="1" maxlength="50" required id="id_name">', html
    )
    assert '<label for="id_name">Name <span class="required">(required)</span></label>' in html
    assert '<input type="email" name="email"' in html
    assert '<p class="help" id="id_email_helptext">Where to write</p>' in html
    assert 'aria-describedby="id_email_helptext"' in html
    assert '<input type="url" name="site"' in html
    assert '<input type="date" name="day" value="2026-01-31"' in html
    assert '<input type="datetime-local" name="at" step="1"' in html
    assert '<input type="number" name="age" value="30" min="0" max="150"' in html
    assert '<input type="number" name="ratio" step="any" min="0.5"' in html
    assert '<input type="checkbox" name="ok" id="id_ok">' in html  # default false: unchecked
    # Short single-selects are radio buttons: the default chosen, or (optional) no answer.
    assert re.search(r'<input type="radio" name="size" value="m" id="id_size_2" checked>', html)
    assert re.search(
        r'<input type="radio" name="color" value="" id="id_color_0" checked>\s*\(no answer\)', html
    )
    assert re.search(r'<input type="radio" name="color" value="g" id="id_color_2">\s*Green', html)
    assert re.search(r'<input type="checkbox" name="tags" value="a"[^>]*checked>', html)
    assert re.search(r'<input type="checkbox" name="tags" value="b"[^>]*id="id_tags_1"\s*>', html)
    assert "<legend>Tags" not in html  # the property name is the label when there is no title
    assert '<legend>tags <span class="required">' not in html
    assert "<legend>tags</legend>" in html
    assert '<label for="id_pets_1"><input type="checkbox" name="pets" value="dog"' in html


def test_accepting_records_the_answer_and_resumes_the_task(
    client, operator, ask, task, django_capture_on_commit_callbacks
) -> None:
    request = ask()
    client.force_login(operator)

    with django_capture_on_commit_callbacks() as callbacks:
        response = client.post(
            url(request), {"approve": "true", "note": "fine", "_action": "accept"}, follow=True
        )

    assert response.redirect_chain == [("/inbox/", 302)]
    assert (
        "You answered the question of refund_payment (Approve the refund: Yes; Note: fine)."
        in response.content.decode()
    )
    row = InputRequest.objects.get(pk=request.pk)
    assert row.status == "answered"
    assert row.answer == {"action": "accept", "content": {"approve": True, "note": "fine"}}
    assert (row.answered_by_user, row.channel) == (operator, "inbox")
    assert TaskEvent.objects.filter(task=task, kind="input_answered", actor="olga").exists()
    assert Dispatch.objects.filter(task=task).count() == 1
    assert len(callbacks) == 1


def test_a_required_yes_or_no_left_unchosen_is_refused(client, operator, ask) -> None:
    request = ask()
    client.force_login(operator)

    response = client.post(url(request), {"note": "", "_action": "accept"})

    html = response.content.decode()
    assert '<p class="field-error" id="id_approve_error">Choose Yes or No.</p>' in html
    assert InputRequest.objects.get(pk=request.pk).status == "pending"


def test_no_answers_false_and_empty_optional_fields_are_left_out(client, operator, ask) -> None:
    request = ask()
    client.force_login(operator)
    client.post(url(request), {"approve": "false", "note": "", "_action": "accept"})
    assert InputRequest.objects.get(pk=request.pk).answer == {
        "action": "accept",
        "content": {"approve": False},
    }


def test_an_unticked_box_with_a_default_answers_false(client, operator, ask) -> None:
    schema = {"type": "object", "properties": {"notify": {"type": "boolean", "default": True}}}
    request = ask(schema=schema)
    client.force_login(operator)
    assert 'name="notify" id="id_notify" checked' in client.get(url(request)).content.decode()
    client.post(url(request), {"_action": "accept"})
    assert InputRequest.objects.get(pk=request.pk).answer == {
        "action": "accept",
        "content": {"notify": False},
    }


def test_an_htmx_answer_returns_the_panel_and_refreshes_the_list(client, operator, ask) -> None:
    request = ask()
    client.force_login(operator)

    response = client.post(url(request), {"approve": "false", "_action": "accept"}, **HTMX)

    html = response.content.decode()
    assert response.status_code == 200
    assert json.loads(response["HX-Trigger"]) == {"inbox-changed": {}}
    assert "<html" not in html
    assert 'role="status"' in html and "You answered this question:" in html
    # What was sent, in the form's words: a "No" reads as one, not as "accepted".
    assert "<div><dt>Approve the refund</dt><dd>No</dd></div>" in html
    assert "<form" not in html


def test_the_panel_shows_the_tasks_status_and_refreshes_it_until_the_task_ends(
    client, operator, ask, task
) -> None:
    from tasks_app import transitions as tasks

    request = ask()
    client.force_login(operator)
    status_url = f"/inbox/{request.pk}/task-status/"
    answered = client.post(url(request), {"approve": "false", "_action": "accept"}, **HTMX)
    html = answered.content.decode()
    assert re.search(r'<dd aria-live="polite">\s*<span id="answer-task-status"', html)
    assert f'hx-get="{status_url}" hx-trigger="every 2s"' in html
    assert '<span class="status status-working">Working</span>' in html

    tasks.complete(
        task_id=task.pk,
        result={"content": [{"type": "text", "text": "Refund of pay_123 was declined."}],
                "isError": True},
    )  # fmt: skip
    html = client.get(status_url, **HTMX).content.decode()
    assert '<span class="status status-completed">Completed</span>' in html
    assert '<span class="status status-failed">tool error</span>' in html
    assert "Refund of pay_123 was declined." in html
    assert "hx-trigger" not in html  # the task has ended: the refresh stops
    assert "Completed" in client.get(url(request)).content.decode()


def test_the_task_status_is_only_for_those_who_may_see_the_question(client, outsider, ask) -> None:
    request = ask()
    client.force_login(outsider)
    assert client.get(f"/inbox/{request.pk}/task-status/").status_code == 404


def test_validation_errors_are_shown_next_to_their_fields(client, operator, ask) -> None:
    request = ask(schema=EVERY_FIELD_KIND)
    client.force_login(operator)

    response = client.post(
        url(request),
        {"name": "", "age": "abc", "email": "not-an-email", "_action": "accept"},
    )

    html = response.content.decode()
    assert response.status_code == 200
    assert '<p class="field-error" id="id_name_error">This field is required.</p>' in html
    assert '<p class="field-error" id="id_age_error">Enter a whole number.</p>' in html
    # Fields that converted are checked against the schema in the same round.
    assert '<p class="field-error" id="id_email_error">Must be an email address.</p>' in html
    assert 'aria-invalid="true"' in html
    assert 'aria-describedby="id_name_error"' in html
    assert InputRequest.objects.get(pk=request.pk).status == "pending"


def test_schema_rules_beyond_field_types_are_explained_inline(client, operator, ask) -> None:
    request = ask(schema=EVERY_FIELD_KIND)
    client.force_login(operator)

    html = client.post(
        url(request),
        {"name": "Ada", "email": "ada@example.com", "tags": ["a", "b", "c"], "_action": "accept"},
    ).content.decode()

    assert '<p class="field-error" id="id_tags_error">Must have at most 2 selected.</p>' in html
    assert 'value="Ada"' in html  # what was typed is kept
    assert InputRequest.objects.get(pk=request.pk).status == "pending"


def test_a_valid_answer_to_every_field_kind_is_typed(client, operator, ask) -> None:
    request = ask(schema=EVERY_FIELD_KIND)
    client.force_login(operator)

    client.post(
        url(request),
        {
            "name": "Ada",
            "email": "ada@example.com",
            "site": "https://example.com/a",
            "day": "2026-03-01",
            "at": "2026-03-01T09:30:00",
            "age": "36",
            "ratio": "0.75",
            "ok": "on",
            "size": "s",
            "color": "r",
            "tags": ["a", "b"],
            "pets": ["cat"],
            "_action": "accept",
        },
    )

    assert InputRequest.objects.get(pk=request.pk).answer == {
        "action": "accept",
        "content": {
            "name": "Ada",
            "email": "ada@example.com",
            "site": "https://example.com/a",
            "day": "2026-03-01",
            "at": "2026-03-01T09:30:00Z",
            "age": 36,
            "ratio": 0.75,
            "ok": True,
            "size": "s",
            "color": "r",
            "tags": ["a", "b"],
            "pets": ["cat"],
        },
    }


def test_decline_ignores_the_form(client, operator, ask) -> None:
    request = ask(schema=EVERY_FIELD_KIND)
    client.force_login(operator)
    response = client.post(url(request), {"age": "abc", "_action": "decline"})
    assert response.status_code == 302
    row = InputRequest.objects.get(pk=request.pk)
    assert (row.status, row.answer) == ("declined", {"action": "decline"})


def test_cancel_is_recorded_as_cancelled(client, operator, ask) -> None:
    request = ask()
    client.force_login(operator)
    client.post(url(request), {"_action": "cancel"})
    assert InputRequest.objects.get(pk=request.pk).status == "cancelled"


def test_a_post_without_a_button_is_refused_and_changes_nothing(client, operator, ask) -> None:
    request = ask()
    client.force_login(operator)
    response = client.post(url(request), {"approve": "true", "_action": "approve"})
    assert response.status_code == 400
    assert "Choose Accept, Decline or Cancel." in response.content.decode()
    assert InputRequest.objects.get(pk=request.pk).status == "pending"


def test_a_second_operator_is_told_who_answered_first(
    client, operator, ask, task, django_user_model
) -> None:
    request = ask()
    sam = django_user_model.objects.create_user(username="sam", password="pw-sam-12345")
    task.client.tenant.members.add(sam)
    grant_role(sam, "answerer")
    # Both open the form; olga answers first.
    olga_client, sam_client = Client(), Client()
    olga_client.force_login(operator)
    sam_client.force_login(sam)
    assert b"<form" in sam_client.get(url(request)).content
    olga_client.post(url(request), {"approve": "true", "_action": "accept"})

    response = sam_client.post(url(request), {"_action": "decline"})

    html = response.content.decode()
    answered_at = InputRequest.objects.get(pk=request.pk).answered_at
    assert response.status_code == 200
    assert 'id="already-answered"' in html
    assert "Already answered." in html
    assert "olga" in html and "chose Accept" in html
    assert f"{answered_at:%Y-%m-%d %H:%M:%S} UTC" in html
    assert "nothing changed" in html
    assert '<form method="post"\n          action="/inbox/' not in html
    row = InputRequest.objects.get(pk=request.pk)
    assert (row.status, row.answered_by_user) == ("answered", operator)
    ignored = TaskEvent.objects.get(task=task, kind="input_answer_ignored")
    assert (ignored.actor, ignored.detail["action"]) == ("sam", "decline")


def test_the_already_answered_message_also_comes_back_over_htmx(
    client, operator, ask, task
) -> None:
    request = ask()
    client.force_login(operator)
    client.post(url(request), {"approve": "true", "_action": "accept"})

    response = client.post(url(request), {"approve": "true", "_action": "accept"}, **HTMX)

    assert response.status_code == 200  # htmx swaps it in; an error status would be dropped
    assert b"Already answered." in response.content
    assert "HX-Trigger" not in response


def test_an_answered_question_shows_its_answer_instead_of_a_form(client, operator, ask) -> None:
    request = ask()
    client.force_login(operator)
    client.post(url(request), {"_action": "decline"})
    html = client.get(url(request)).content.decode()
    assert "This question is declined by olga at" in html
    assert '<button type="submit" name="_action"' not in html


def test_other_tenants_and_client_questions_are_not_found(
    client, operator, outsider, ask, bob
) -> None:
    from elicitations import transitions

    theirs = transitions.open_request(
        task=Task.objects.create(client=bob, tool_name="refund_payment", arguments={}),
        ask_key="q",
        message="globex's",
        audience="operator",
    )
    client_only = ask(audience="client")
    mine = ask()
    client.force_login(operator)
    for request in (theirs, client_only):
        assert client.get(url(request)).status_code == 404
        assert client.post(url(request), {"_action": "decline"}).status_code == 404
    client.force_login(outsider)
    assert client.post(url(mine), {"_action": "decline"}).status_code == 404
    assert set(InputRequest.objects.values_list("status", flat=True)) == {"pending"}


def test_it_needs_a_login(client, ask) -> None:
    request = ask()
    assert client.get(url(request))["Location"] == f"/accounts/login/?next=/inbox/{request.pk}/"
    assert client.post(url(request), {"_action": "decline"}).status_code == 302
    assert InputRequest.objects.get(pk=request.pk).status == "pending"


def test_posts_need_the_csrf_token(operator, ask) -> None:
    request = ask()
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(operator)

    assert browser.post(url(request), {"_action": "decline"}).status_code == 403
    assert InputRequest.objects.get(pk=request.pk).status == "pending"

    html = browser.get(url(request)).content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="(\w+)"', html)
    assert token
    # htmx sends the token from <body hx-headers>; a plain form posts it as a field.
    response = browser.post(
        url(request), {"_action": "decline"}, HTTP_X_CSRFTOKEN=token.group(1), **HTMX
    )
    assert response.status_code == 200
    assert InputRequest.objects.get(pk=request.pk).status == "declined"


def test_untrusted_text_on_the_answer_page_is_escaped(client, operator, alice) -> None:
    from elicitations import transitions

    evil = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    task = Task.objects.create(client=alice, tool_name="refund_payment", arguments={"r": evil})
    request = transitions.open_request(
        task=task,
        ask_key="q",
        message=evil,
        audience="operator",
        schema={
            "type": "object",
            "properties": {
                "pick": {
                    "type": "string",
                    "title": evil,
                    "description": evil,
                    "oneOf": [{"const": evil, "title": evil}],
                }
            },
        },
    )
    client.force_login(operator)

    html = client.get(url(request)).content.decode()

    assert "<script>alert" not in html
    assert "<img src=x" not in html
    assert (
        "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;"
        in html
    )


def test_an_answer_from_the_inbox_writes_one_audit_entry(client, operator, ask, task) -> None:
    from tasks_app.models import AuditEntry

    request = ask()
    client.force_login(operator)
    AuditEntry.objects.all().delete()  # the sign-in's

    client.post(url(request), {"approve": "true", "_action": "accept"})
    client.post(url(request), {"approve": "false", "_action": "accept"})  # too late

    first, second = AuditEntry.objects.order_by("id")
    assert (first.action, first.outcome, first.actor) == ("question.answer", "done", "olga")
    assert first.target == f"question:{request.pk}" and first.tenant == task.client.tenant
    assert first.detail == {"task": task.pk, "answer": "accept"}
    assert (second.outcome, second.detail["reason"]) == ("refused", "already_answered")
