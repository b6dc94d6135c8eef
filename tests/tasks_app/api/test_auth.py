"""Who may call /api/: a personal operator token, or a signed-in operator's session."""

from __future__ import annotations

from datetime import timedelta

import time_machine
from django.utils import timezone

from tasks_app import tokens
from tasks_app.models import OperatorToken
from tests.tasks_app.api.conftest import Api


def test_an_operator_token_authenticates_as_its_user(as_operator) -> None:
    response = as_operator.get("/api/tasks/")
    assert response.status_code == 200 and response.json()["results"] == []


def test_no_credentials_is_401_with_a_bearer_challenge(client) -> None:
    response = Api(client, None).get("/api/tasks/")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == 'Bearer realm="taskdesk-api"'
    assert response.json() == {"detail": "Authentication credentials were not provided."}


def test_an_unknown_token_is_401(client, operator) -> None:
    for token in ("tdo_nope", "tdk_a-client-token", "x" * 500):
        response = Api(client, token).get("/api/tasks/")
        assert response.status_code == 401
        assert response.json() == {
            "detail": "Unknown operator token (make one with manage.py create_operator_token)."
        }


def test_a_revoked_token_is_401(client, operator, operator_token) -> None:
    tokens.revoke_operator_tokens(operator, name="tests")
    response = Api(client, operator_token).get("/api/tasks/")
    assert response.status_code == 401
    assert response.json() == {"detail": "This operator token has been revoked."}


def test_the_token_of_an_inactive_user_is_401(client, operator, operator_token) -> None:
    operator.is_active = False
    operator.save()
    response = Api(client, operator_token).get("/api/tasks/")
    assert response.status_code == 401
    assert response.json() == {"detail": "This operator token's user is inactive."}


def test_a_malformed_authorization_header_is_401(client, operator) -> None:
    response = client.get("/api/tasks/", headers={"Authorization": "Basic b2xnYTpwdw=="})
    assert response.status_code == 401
    assert "must be 'Bearer <operator token>'" in response.json()["detail"]


def test_last_used_is_written_at_most_once_a_minute(as_operator) -> None:
    now = timezone.now()
    with time_machine.travel(now, tick=False):
        as_operator.get("/api/tasks/")
    first = OperatorToken.objects.get().last_used_at
    with time_machine.travel(now + timedelta(seconds=30), tick=False):
        as_operator.get("/api/tasks/")
    assert OperatorToken.objects.get().last_used_at == first == now
    with time_machine.travel(now + timedelta(minutes=2), tick=False):
        as_operator.get("/api/tasks/")
    assert OperatorToken.objects.get().last_used_at == now + timedelta(minutes=2)


def test_a_signed_in_operator_gets_the_browsable_api(client, operator) -> None:
    client.force_login(operator)
    page = client.get("/api/tasks/", headers={"Accept": "text/html"})
    assert page.status_code == 200 and "text/html" in page["Content-Type"]
    assert "Task" in page.content.decode() and "olga" in page.content.decode()
    assert client.get("/api/", headers={"Accept": "text/html"}).status_code == 200


def test_a_session_post_needs_the_csrf_token(operator, alice) -> None:
    from django.test import Client

    from tests.tasks_app.test_bulk import make

    [task] = make(alice, 1)
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(operator)
    response = browser.post(f"/api/tasks/{task.pk}/cancel/")
    assert response.status_code == 403
    assert "CSRF" in response.json()["detail"]
