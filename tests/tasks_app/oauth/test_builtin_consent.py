"""The consent page (/oauth/authorize): a signed-in person, CSRF, the tenants their role
allows, approving (a grant and the tenant's client for the app) and denying."""

from __future__ import annotations

import re

import pytest
from django.test import Client as HttpClient

from tasks_app.models import AuditAction, AuditEntry, Client, OAuthGrant
from tasks_app.operators import grant_role
from tests.tasks_app.oauth.builtin_flow import (
    PUBLIC_URL,
    REDIRECT_URI,
    approve,
    authorize_query,
    pkce,
    query_of,
    registered,
)

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _public_url(settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_PUBLIC_URL = PUBLIC_URL


@pytest.fixture
def query(client) -> str:  # type: ignore[no-untyped-def]
    _, challenge = pkce()
    return authorize_query(registered(client), challenge)


def test_it_asks_a_signed_out_person_to_log_in_first(client, query) -> None:  # type: ignore[no-untyped-def]
    response = client.get(f"/oauth/authorize?{query}")

    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=/oauth/authorize%3F")


def test_after_logging_in_the_person_comes_back_to_the_request(client, operator, query) -> None:  # type: ignore[no-untyped-def]
    login = client.get(f"/oauth/authorize?{query}")["Location"]
    next_url = query_of(login)["next"]

    answer = client.post(login, {"username": "olga", "password": "pw-olga-123", "next": next_url})

    assert answer.status_code == 302
    assert answer["Location"] == next_url
    assert client.get(next_url).status_code == 200


def test_it_shows_the_app_its_redirect_host_and_the_scopes(client, operator, query) -> None:  # type: ignore[no-untyped-def]
    client.force_login(operator)

    page = client.get(f"/oauth/authorize?{query}").content.decode()

    assert "Connect Claude Desktop to Taskdesk?" in page
    assert '<dd class="mono" id="redirect-host">127.0.0.1:33418</dd>' in page
    assert 'id="loopback-warning"' in page
    assert "Call tools and follow, cancel and read the results of the tasks it starts" in page
    assert "(tasks:answer)" in page
    assert 'name="tenant" value="' in page


def test_the_page_lets_its_form_go_back_to_the_app(client, operator, query) -> None:  # type: ignore[no-untyped-def]
    client.force_login(operator)

    policy = client.get(f"/oauth/authorize?{query}")["Content-Security-Policy"]

    assert "form-action 'self' http://127.0.0.1:33418" in policy


def test_the_answer_needs_the_csrf_token(operator, alice, query) -> None:  # type: ignore[no-untyped-def]
    http = HttpClient(enforce_csrf_checks=True)
    http.force_login(operator)
    page = http.get(f"/oauth/authorize?{query}").content.decode()

    forged = http.post(
        f"/oauth/authorize?{query}", {"tenant": alice.tenant_id, "decision": "approve"}
    )
    assert forged.status_code == 403
    assert not OAuthGrant.objects.exists()

    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)  # type: ignore[union-attr]
    answer = http.post(
        f"/oauth/authorize?{query}",
        {"tenant": alice.tenant_id, "decision": "approve", "csrfmiddlewaretoken": token},
    )
    assert answer.status_code == 302
    assert "code" in query_of(answer["Location"])


def test_denying_sends_access_denied_back_with_the_issuer(client, operator, query) -> None:  # type: ignore[no-untyped-def]
    client.force_login(operator)

    answer = client.post(f"/oauth/authorize?{query}", {"decision": "deny"})

    assert answer.status_code == 302
    assert answer["Location"].startswith(REDIRECT_URI + "?")
    assert query_of(answer["Location"]) == {
        "error": "access_denied",
        "error_description": "The resource owner or authorization server denied the request",
        "state": "st-123",
        "iss": PUBLIC_URL,
    }
    assert not OAuthGrant.objects.exists()


def test_approving_records_the_grant_and_a_client_of_the_tenant(
    client, operator, alice, query
) -> None:  # type: ignore[no-untyped-def]
    client.force_login(operator)

    approve(client, query, alice.tenant)

    grant = OAuthGrant.objects.get()
    assert (grant.person, grant.tenant, grant.scopes) == (
        operator,
        alice.tenant,
        "tasks:call tasks:answer",
    )
    assert grant.app.name == "Claude Desktop"
    assert grant.client.tenant == alice.tenant
    assert grant.client.name.startswith("claude-desktop-")
    entry = AuditEntry.objects.get(action=AuditAction.APP_CONNECT)
    assert (entry.actor, entry.tenant_id, entry.target) == (
        "olga",
        alice.tenant_id,
        f"grant:{grant.pk}",
    )
    assert entry.detail["app"] == "Claude Desktop"


def test_approving_again_renews_the_grant_and_keeps_the_client(
    client, operator, alice, query, django_user_model
) -> None:  # type: ignore[no-untyped-def]
    client.force_login(operator)
    approve(client, query, alice.tenant)
    approve(client, query, alice.tenant)
    colleague = django_user_model.objects.create_user(username="carl", password="pw")
    alice.tenant.members.add(colleague)
    grant_role(colleague, "operator")
    client.force_login(colleague)

    approve(client, query, alice.tenant)

    assert OAuthGrant.objects.filter(person=operator).count() == 1
    grants = OAuthGrant.objects.all()
    assert len({grant.client_id for grant in grants}) == 1
    assert Client.objects.filter(oauth_grants__isnull=False).distinct().count() == 1


def test_a_viewer_may_not_connect_an_app(client, viewer, alice, query) -> None:  # type: ignore[no-untyped-def]
    client.force_login(viewer)

    page = client.get(f"/oauth/authorize?{query}").content.decode()
    answer = client.post(
        f"/oauth/authorize?{query}", {"tenant": alice.tenant_id, "decision": "approve"}
    )

    assert 'id="no-tenants"' in page
    assert answer.status_code == 400
    assert "Choose the tenant the app acts for." in answer.content.decode()
    assert not OAuthGrant.objects.exists()


def test_a_person_sees_only_their_own_tenants(client, operator, bob, query) -> None:  # type: ignore[no-untyped-def]
    client.force_login(operator)

    page = client.get(f"/oauth/authorize?{query}").content.decode()
    answer = client.post(
        f"/oauth/authorize?{query}", {"tenant": bob.tenant_id, "decision": "approve"}
    )

    assert "globex" not in page
    assert answer.status_code == 400
    assert not OAuthGrant.objects.exists()
