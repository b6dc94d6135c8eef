"""/tasks/<id>/: the task page an operator opens from the inbox."""

from __future__ import annotations

import pytest

from elicitations import transitions
from tasks_app import transitions as task_transitions
from tasks_app.models import Effect, Task

EVIL = '<script>alert("x")</script><img src=x onerror=alert(1)>'
ESCAPED = "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;"


@pytest.fixture
def task(alice):  # type: ignore[no-untyped-def]
    return Task.objects.create(
        client=alice,
        tool_name="refund_payment",
        arguments={"payment_id": "pay_9", "amount_cents": 20000, "reason": EVIL},
    )


def test_it_shows_status_arguments_questions_effects_and_timeline(client, operator, task) -> None:
    question = transitions.open_request(
        task=task, ask_key="approval", message="Approve?", audience="operator"
    )
    transitions.answer(
        task=task,
        key=question.key,
        response={"action": "accept", "content": {}},
        channel="inbox",
        user=operator,
    )
    Effect.objects.create(
        task=task,
        seq=1,
        name="refund",
        target="pay_9",
        downstream_key=f"{task.pk}:refund:1",
        state="confirmed",
        detail={"refund_id": "rf_1"},
    )
    Effect.objects.create(
        task=task,
        seq=2,
        name="hold",
        target="pay_9",
        downstream_key=f"{task.pk}:hold:2",
        state="compensated",
        compensable=True,
    )
    task_transitions.complete(
        task_id=task.pk, result={"content": [{"type": "text", "text": "refunded rf_1"}]}
    )
    client.force_login(operator)

    html = client.get(f"/tasks/{task.pk}/").content.decode()

    assert 'class="status status-completed" id="task-status">Completed</span>' in html
    assert "&quot;payment_id&quot;: &quot;pay_9&quot;" in html
    assert "&quot;amount_cents&quot;: 20000" in html
    assert "refunded rf_1" in html
    assert "Approve?" in html and "olga via inbox" in html
    assert (
        "<td>refund</td>" in html and ">confirmed</span>" in html and f"{task.pk}:refund:1" in html
    )
    assert (
        "<td>hold <span" in html
        and "(undoable)</span></td>" in html
        and ">compensated</span>" in html
    )
    for kind in ("input_requested", "input_answered", "resumed", "completed"):
        assert f"<strong>{kind}</strong>" in html
    # A finished task's page stops polling.
    assert 'hx-trigger="every 2s' not in html


def test_a_running_task_refreshes_itself(client, operator, task) -> None:
    client.force_login(operator)
    html = client.get(f"/tasks/{task.pk}/").content.decode()
    assert 'hx-trigger="every 2s" data-poll-visible' in html
    part = client.get(f"/tasks/{task.pk}/", HTTP_HX_REQUEST="true").content.decode()
    assert part.lstrip().startswith('<div id="task-body"') and "<nav" not in part


def test_untrusted_text_is_escaped(client, operator, task) -> None:
    transitions.open_request(task=task, ask_key="q", message=EVIL, audience="operator")
    task_transitions.complete(
        task_id=task.pk, result={"content": [{"type": "text", "text": EVIL}], "isError": True}
    )
    client.force_login(operator)

    html = client.get(f"/tasks/{task.pk}/").content.decode()

    assert "<script>alert" not in html and "<img src=x" not in html
    assert ESCAPED in html


def test_other_tenants_tasks_are_not_found(client, operator, outsider, bob) -> None:
    theirs = Task.objects.create(client=bob, tool_name="refund_payment", arguments={})
    client.force_login(operator)
    assert client.get(f"/tasks/{theirs.pk}/").status_code == 404
    assert client.get("/tasks/does-not-exist/").status_code == 404
    client.force_login(outsider)
    assert client.get(f"/tasks/{theirs.pk}/").status_code == 404


def test_a_superuser_sees_any_task(client, bob, django_user_model) -> None:
    theirs = Task.objects.create(client=bob, tool_name="refund_payment", arguments={})
    client.force_login(
        django_user_model.objects.create_superuser(username="root", password="pw-root-123")
    )
    assert client.get(f"/tasks/{theirs.pk}/").status_code == 200


def test_it_needs_a_login(client, task) -> None:
    response = client.get(f"/tasks/{task.pk}/")
    assert response["Location"] == f"/accounts/login/?next=/tasks/{task.pk}/"
