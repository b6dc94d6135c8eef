"""The /inbox/ page: login, what it lists, escaping, and its self-refresh."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from elicitations import transitions
from tasks_app.models import Task

SCRIPT = '<script>alert("x")</script>'
IMG = "<img src=x onerror=alert(1)>"
HTMX = {"HTTP_HX_REQUEST": "true"}


def test_it_needs_a_login(client) -> None:
    response = client.get("/inbox/")
    assert response.status_code == 302
    assert response["Location"] == "/accounts/login/?next=/inbox/"


def test_an_expired_session_reloads_the_whole_page_to_log_in(client) -> None:
    """A poll must not swap the login page into the list."""
    response = client.get(
        "/inbox/?since=x", HTTP_HX_REQUEST="true", HTTP_HX_CURRENT_URL="http://testserver/inbox/7/"
    )
    assert response.status_code == 200
    assert response["HX-Redirect"] == "/accounts/login/?next=/inbox/7/"
    assert response.content == b""


def test_logging_in_lands_on_the_dashboard(client, operator) -> None:
    page = client.get("/accounts/login/")
    assert page.status_code == 200
    assert b'<label for="id_username">Username</label>' in page.content
    assert b'<label for="id_password">Password</label>' in page.content

    response = client.post(
        "/accounts/login/", {"username": "olga", "password": "pw-olga-123"}, follow=True
    )
    assert response.redirect_chain == [("/tasks/", 302)]
    assert b'<h1 id="tasks-heading">Tasks</h1>' in response.content


def test_a_wrong_password_says_so(client, operator) -> None:
    response = client.post("/accounts/login/", {"username": "olga", "password": "nope"})
    assert response.status_code == 200
    assert b'role="alert"' in response.content
    assert b"Please enter a correct username and password" in response.content


def test_it_lists_each_question_with_its_context(client, operator, ask, task) -> None:
    deadline = datetime(2031, 5, 6, 7, 8, tzinfo=UTC)
    request = ask(deadline=deadline)
    client.force_login(operator)

    html = client.get("/inbox/").content.decode()

    card = html[html.index(f'id="request-{request.pk}"') :]
    assert '<h2 class="request-tool">refund_payment</h2>' in card
    assert "for alice" in card
    assert "Approve a refund of 200.00?" in card
    assert "<div><dt>payment_id</dt><dd>pay_123</dd></div>" in card
    assert "<div><dt>amount_cents</dt><dd>20000</dd></div>" in card
    assert "just now" in card
    assert "2031-05-06 07:08 UTC" in card
    assert f'href="/inbox/{request.pk}/"' in card
    assert f'href="/tasks/{task.pk}/"' in card


def test_long_argument_values_are_cut_at_80_characters(client, operator, alice) -> None:
    task = Task.objects.create(
        client=alice,
        tool_name="send_note",
        arguments={"text": "a" * 200, "items": list(range(100)), "short": "ok"},
    )
    transitions.open_request(task=task, ask_key="q", message="Send?", audience="operator")
    client.force_login(operator)

    html = client.get("/inbox/").content.decode()

    assert f"<dd>{'a' * 79}…</dd>" in html
    assert "a" * 80 not in html
    items = re.search(r"<dt>items</dt><dd>([^<]*)</dd>", html)
    assert items and len(items.group(1)) == 80 and items.group(1).startswith("[0, 1, 2")
    assert "<dd>ok</dd>" in html


def test_arguments_left_null_are_not_shown(client, operator, alice) -> None:
    # refund_payment's request_key is null when the key came in the Idempotency-Key header.
    arguments = {"payment_id": "p-1", "amount_cents": 20000, "reason": "r", "request_key": None}
    task = Task.objects.create(client=alice, tool_name="refund_payment", arguments=arguments)
    request = transitions.open_request(
        task=task, ask_key="q", message="Refund?", audience="operator"
    )
    client.force_login(operator)

    for page in ("/inbox/", f"/inbox/{request.pk}/"):
        html = client.get(page).content.decode()
        assert "<dt>payment_id</dt><dd>p-1</dd>" in html
        assert "request_key" not in html
        assert "null" not in html


def test_it_lists_the_most_urgent_deadline_first(client, operator, ask) -> None:
    now = timezone.now()
    later = ask(ask_key="later", message="LATER", deadline=now + timedelta(hours=3))
    none = ask(ask_key="none", message="NONE")
    soon = ask(ask_key="soon", message="SOON", deadline=now + timedelta(minutes=3))
    client.force_login(operator)

    html = client.get("/inbox/").content.decode()

    order = re.findall(r'id="request-(\d+)"', html)
    assert order == [str(soon.pk), str(later.pk), str(none.pk)]


def test_it_hides_other_tenants_questions(client, operator, outsider, bob) -> None:
    theirs = Task.objects.create(client=bob, tool_name="refund_payment", arguments={})
    transitions.open_request(task=theirs, ask_key="q", message="GLOBEX SECRET", audience="operator")
    for user in (operator, outsider):
        client.force_login(user)
        html = client.get("/inbox/").content.decode()
        assert "GLOBEX SECRET" not in html
        assert "Nothing is waiting for an answer." in html


def test_client_questions_are_not_offered(client, operator, ask) -> None:
    ask(audience="client", message="CLIENT ONLY")
    client.force_login(operator)
    assert b"CLIENT ONLY" not in client.get("/inbox/").content


def test_the_navigation_shows_the_pending_count(client, operator, ask) -> None:
    client.force_login(operator)
    assert b'<span id="inbox-count" class="badge badge-empty"></span>' in (
        client.get("/inbox/").content
    )
    ask(ask_key="a")
    ask(ask_key="b")
    html = client.get("/inbox/").content.decode()
    assert (
        '<span id="inbox-count" class="badge">2<span class="visually-hidden"> waiting</span></span>'
        in html
    )


@pytest.mark.parametrize("text", [SCRIPT, IMG])
def test_tool_and_client_text_is_escaped(client, operator, alice, text) -> None:
    task = Task.objects.create(
        client=alice, tool_name="refund_payment", arguments={"reason": text, text: "key"}
    )
    transitions.open_request(task=task, ask_key="q", message=f"Approve? {text}", audience="any")
    client.force_login(operator)

    html = client.get("/inbox/").content.decode()

    assert text not in html
    assert "<script>alert" not in html
    assert "<img src=x" not in html
    escaped = text.replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
    assert f"Approve? {escaped}" in html
    assert f"<dd>{escaped}</dd>" in html


def test_the_poll_returns_only_the_list_and_the_badge(client, operator, ask) -> None:
    ask(message="FIRST")
    client.force_login(operator)

    response = client.get("/inbox/", **HTMX)

    html = response.content.decode()
    assert response.status_code == 200
    assert html.lstrip().startswith('<div id="inbox-list"')
    assert "<html" not in html and "<nav" not in html
    assert "FIRST" in html
    assert 'id="inbox-count" class="badge" hx-swap-oob="true">1<' in html
    assert 'hx-trigger="every 3s, inbox-changed from:body" data-poll-visible' in html


def test_the_poll_answers_204_until_something_changes(client, operator, ask, task) -> None:
    first = ask(message="FIRST")
    client.force_login(operator)
    since = re.search(r"since=(\w+)", client.get("/inbox/").content.decode())
    assert since

    assert client.get(f"/inbox/?since={since.group(1)}", **HTMX).status_code == 204

    ask(ask_key="two", message="SECOND")
    added = client.get(f"/inbox/?since={since.group(1)}", **HTMX)
    assert added.status_code == 200
    assert b"FIRST" in added.content and b"SECOND" in added.content

    transitions.answer(
        task=task, key=first.key, response={"action": "decline"}, channel="inbox", user=operator
    )
    removed = client.get(f"/inbox/?since={since.group(1)}", **HTMX)
    assert b"FIRST" not in removed.content and b"SECOND" in removed.content
    assert b'hx-swap-oob="true">1<' in removed.content


def test_a_plain_page_load_ignores_since(client, operator, ask) -> None:
    ask()
    client.force_login(operator)
    since = re.search(r"since=(\w+)", client.get("/inbox/").content.decode())
    assert since
    assert client.get(f"/inbox/?since={since.group(1)}").status_code == 200


def test_the_page_loads_htmx_2_and_sends_csrf_with_every_htmx_request(client, operator) -> None:
    client.force_login(operator)
    html = client.get("/inbox/").content.decode()
    assert '<script src="/static/django_htmx/htmx-2.min.js" defer></script>' in html
    token = re.search(r"<body hx-headers='\{\"X-CSRFToken\": \"(\w+)\"\}'>", html)
    assert token and len(token.group(1)) == 64


def test_logout_is_a_csrf_protected_post(client, operator) -> None:
    client.force_login(operator)
    html = client.get("/inbox/").content.decode()
    assert re.search(
        r'<form class="logout" method="post" action="/accounts/logout/">\s*'
        r'<input type="hidden" name="csrfmiddlewaretoken"',
        html,
    )
    assert client.post("/accounts/logout/").status_code == 302
    assert client.get("/inbox/").status_code == 302
