"""/apps/: the connected apps, and revoking one, which stops its tokens at once."""

from __future__ import annotations

import pytest

from tasks_app.models import AuditAction, AuditEntry, AuditOutcome, OAuthGrant, OAuthToken
from tasks_app.oauth import builtin
from tasks_app.operators import grant_role
from tests.tasks_app.mcp.conftest import Mcp
from tests.tasks_app.oauth.builtin_flow import PUBLIC_URL, refresh, tokens_for

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _public_url(settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_PUBLIC_URL = PUBLIC_URL
    builtin.forget_cached()


@pytest.fixture
def connected(client, operator, alice):  # type: ignore[no-untyped-def]
    """Olga connected Claude Desktop to acme; its tokens, with the grant."""
    got = tokens_for(client, operator, alice.tenant)
    return {**got, "grant": OAuthGrant.objects.get()}


def test_it_lists_each_grant_with_its_person_tenant_scopes_and_last_use(client, connected) -> None:  # type: ignore[no-untyped-def]
    Mcp(client, connected["access_token"]).call("tools/list")

    page = client.get("/apps/").content.decode()

    grant = connected["grant"]
    row = page[page.index(f'id="grant-{grant.pk}"') :]
    assert "<strong>Claude Desktop</strong>" in row
    assert "<td>olga</td>" in row
    assert "<td>acme</td>" in row
    assert '<td class="mono">tasks:call tasks:answer</td>' in row
    assert "never" not in row[: row.index("</tr>")]
    assert f'href="/apps/{grant.pk}/revoke/"' in row
    assert '<a href="/apps/" aria-current="page">Apps</a>' in page


def test_revoking_asks_first(client, connected) -> None:  # type: ignore[no-untyped-def]
    page = client.get(f"/apps/{connected['grant'].pk}/revoke/").content.decode()

    assert "Revoke Claude Desktop for acme?" in page
    assert OAuthGrant.objects.get().revoked_at is None


def test_revoking_stops_its_access_and_refresh_tokens_at_once(client, connected) -> None:  # type: ignore[no-untyped-def]
    mcp = Mcp(client, connected["access_token"])
    assert mcp.call("tools/list").status_code == 200  # now remembered by this process

    answer = client.post(f"/apps/{connected['grant'].pk}/revoke/")

    assert answer.status_code == 302
    assert answer["Location"] == "/apps/"
    assert mcp.call("tools/list").status_code == 401
    assert refresh(client, connected["client_id"], connected["refresh_token"]).status_code == 400
    assert OAuthGrant.objects.get().revoked_at is not None
    assert OAuthToken.objects.get().revoked_at is not None
    entry = AuditEntry.objects.get(action=AuditAction.APP_REVOKE)
    assert (entry.actor, entry.target, entry.outcome) == (
        "olga",
        f"grant:{connected['grant'].pk}",
        AuditOutcome.DONE,
    )
    assert entry.detail["app"] == "Claude Desktop"
    assert 'class="status status-cancelled"' in client.get("/apps/").content.decode()


def test_other_processes_stop_it_within_the_token_cache_time(client, connected, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_TOKEN_CACHE_SECONDS = 0  # another process, whose memory has aged out
    with_other = builtin.verify(connected["access_token"])
    OAuthGrant.objects.update(revoked_at=connected["grant"].created_at)  # revoked elsewhere

    assert with_other is not None
    assert builtin.verify(connected["access_token"]) is None


def test_revoking_needs_the_csrf_token(connected, operator) -> None:  # type: ignore[no-untyped-def]
    from django.test import Client as HttpClient

    http = HttpClient(enforce_csrf_checks=True)
    http.force_login(operator)

    assert http.post(f"/apps/{connected['grant'].pk}/revoke/").status_code == 403
    assert OAuthGrant.objects.get().revoked_at is None


def test_a_revoked_grant_is_revoked_once(client, connected) -> None:  # type: ignore[no-untyped-def]
    client.post(f"/apps/{connected['grant'].pk}/revoke/")
    client.post(f"/apps/{connected['grant'].pk}/revoke/")

    outcomes = AuditEntry.objects.filter(action=AuditAction.APP_REVOKE).values_list(
        "outcome", flat=True
    )
    assert sorted(outcomes) == [AuditOutcome.DONE, AuditOutcome.REFUSED]


def test_an_operator_sees_and_revokes_the_grants_of_their_tenants(
    client, connected, alice, django_user_model
) -> None:  # type: ignore[no-untyped-def]
    other = django_user_model.objects.create_user(username="otto", password="pw")
    alice.tenant.members.add(other)
    grant_role(other, "operator")
    client.force_login(other)

    assert f'id="grant-{connected["grant"].pk}"' in client.get("/apps/").content.decode()
    assert client.post(f"/apps/{connected['grant'].pk}/revoke/").status_code == 302


def test_a_viewer_sees_only_their_own_grants(client, connected, viewer) -> None:  # type: ignore[no-untyped-def]
    client.force_login(viewer)

    page = client.get("/apps/").content.decode()

    assert f'id="grant-{connected["grant"].pk}"' not in page
    assert "No app is connected." in page
    assert client.post(f"/apps/{connected['grant'].pk}/revoke/").status_code == 403
    assert OAuthGrant.objects.get().revoked_at is None


def test_an_outsider_cannot_revoke(client, connected, outsider) -> None:  # type: ignore[no-untyped-def]
    client.force_login(outsider)

    assert client.get(f"/apps/{connected['grant'].pk}/revoke/").status_code == 403


def test_the_page_needs_a_signed_in_person(connected) -> None:  # type: ignore[no-untyped-def]
    from django.test import Client as HttpClient

    response = HttpClient().get("/apps/")

    assert response.status_code == 302
    assert response["Location"] == "/accounts/login/?next=/apps/"
