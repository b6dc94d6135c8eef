"""The built-in authorization server's code flow: PKCE S256, resource indicators, single-use
codes, refresh rotation, revocation, ``iss`` on every redirect, and the token on /mcp."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from tasks_app.models import OAuthCode, OAuthToken
from tasks_app.oauth import builtin
from tests.tasks_app.mcp.conftest import Mcp
from tests.tasks_app.oauth.builtin_flow import (
    FORM,
    PUBLIC_URL,
    REDIRECT_URI,
    approve,
    authorize_query,
    exchange,
    pkce,
    query_of,
    refresh,
    registered,
    tokens_for,
)
from tests.wire import result_of

pytestmark = pytest.mark.django_db


@pytest.fixture
def team(alice):  # type: ignore[no-untyped-def]
    """The tenant of alice, where the operator olga may connect apps."""
    return alice.tenant


@pytest.fixture(autouse=True)
def _public_url(settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_PUBLIC_URL = PUBLIC_URL
    builtin.forget_cached()


def _error_redirect(client, operator, **overrides):  # type: ignore[no-untyped-def]
    client_id = registered(client)
    client.force_login(operator)
    _, challenge = pkce()
    response = client.get(f"/oauth/authorize?{authorize_query(client_id, challenge, **overrides)}")
    assert response.status_code == 302, response.content
    assert response["Location"].startswith(REDIRECT_URI + "?")
    return query_of(response["Location"])


# --- the authorization request ----------------------------------------------------------------


def test_an_approval_redirects_with_the_code_the_state_and_the_issuer(
    client, operator, team
) -> None:  # type: ignore[no-untyped-def]
    client_id = registered(client)
    client.force_login(operator)
    _, challenge = pkce()

    params = approve(client, authorize_query(client_id, challenge), team)

    assert params["code"].startswith("tdc_")
    assert params["state"] == "st-123"
    assert params["iss"] == PUBLIC_URL
    code = OAuthCode.objects.get()
    assert code.code_hash == builtin.hash_secret(params["code"])  # only its hash is kept
    assert code.resource == PUBLIC_URL + "/mcp"
    assert code.code_challenge == challenge


def test_it_refuses_a_plain_challenge(client, operator) -> None:  # type: ignore[no-untyped-def]
    params = _error_redirect(client, operator, code_challenge_method="plain")

    assert params["error"] == "invalid_request"
    assert (
        params["error_description"]
        == "code_challenge_method must be S256 (plain is not supported)."
    )
    assert params["iss"] == PUBLIC_URL
    assert params["state"] == "st-123"


def test_it_refuses_a_request_without_a_challenge(client, operator) -> None:  # type: ignore[no-untyped-def]
    params = _error_redirect(client, operator, code_challenge=None, code_challenge_method=None)

    assert params["error"] == "invalid_request"
    assert params["error_description"] == "PKCE is required: send code_challenge (S256)."
    assert params["iss"] == PUBLIC_URL


def test_it_refuses_a_request_without_a_resource(client, operator) -> None:  # type: ignore[no-untyped-def]
    params = _error_redirect(client, operator, resource=None)

    assert params["error"] == "invalid_target"
    assert params["error_description"] == (
        f"The resource parameter is required: the MCP endpoint {PUBLIC_URL}/mcp"
    )
    assert params["iss"] == PUBLIC_URL


def test_it_refuses_a_resource_of_another_server(client, operator) -> None:  # type: ignore[no-untyped-def]
    params = _error_redirect(client, operator, resource="https://other.example.com/mcp")

    assert params["error"] == "invalid_target"
    assert params["error_description"] == (
        f"This server issues tokens only for the resource {PUBLIC_URL}/mcp"
    )


def test_the_resource_is_compared_in_its_canonical_form(client, operator, team) -> None:  # type: ignore[no-untyped-def]
    client_id = registered(client)
    client.force_login(operator)
    _, challenge = pkce()
    query = authorize_query(client_id, challenge, resource="HTTPS://Taskdesk.Example.com:443/mcp/")

    assert approve(client, query, team)["code"]


def test_it_refuses_an_unknown_scope(client, operator) -> None:  # type: ignore[no-untyped-def]
    params = _error_redirect(client, operator, scope="tasks:call admin")

    assert params["error"] == "invalid_scope"


def test_a_redirect_uri_the_app_did_not_register_is_not_followed(client, operator) -> None:  # type: ignore[no-untyped-def]
    client_id = registered(client)
    client.force_login(operator)
    _, challenge = pkce()
    query = authorize_query(client_id, challenge, redirect_uri="https://evil.example/cb")

    response = client.get(f"/oauth/authorize?{query}")

    assert response.status_code == 400
    assert b"Redirect URI https://evil.example/cb is not supported by client." in response.content


def test_an_unknown_app_is_told_to_the_person(client, operator) -> None:  # type: ignore[no-untyped-def]
    client.force_login(operator)
    _, challenge = pkce()

    response = client.get(f"/oauth/authorize?{authorize_query('nope', challenge)}")

    assert response.status_code == 400
    assert b"The client does not exist on this server." in response.content


# --- the code exchange ----------------------------------------------------------------------------


def test_the_code_and_its_verifier_get_tokens_for_the_mcp_endpoint(client, operator, team) -> None:  # type: ignore[no-untyped-def]
    got = tokens_for(client, operator, team)

    assert got["token_type"] == "Bearer"
    assert got["access_token"].startswith("tda_")
    assert got["refresh_token"].startswith("tdr_")
    assert got["expires_in"] == 3600
    assert got["scope"] == "tasks:call tasks:answer"
    row = OAuthToken.objects.get()
    assert row.access_hash == builtin.hash_secret(got["access_token"])
    assert row.refresh_hash == builtin.hash_secret(got["refresh_token"])
    assert row.resource == PUBLIC_URL + "/mcp"
    access = builtin.verify(got["access_token"])
    assert access is not None
    assert access.client == row.grant.client
    assert access.scopes == frozenset({"tasks:call", "tasks:answer"})
    assert access.issuer == PUBLIC_URL
    assert access.app == "Claude Desktop"
    assert access.person_id == operator.pk
    assert access.grant_id == row.grant_id


def test_the_token_works_on_the_mcp_endpoint(client, operator, team) -> None:  # type: ignore[no-untyped-def]
    got = tokens_for(client, operator, team)

    result = result_of(Mcp(client, got["access_token"]).call("tools/list"))

    assert any(tool["name"] == "slow_echo" for tool in result["tools"])


def test_it_refuses_a_verifier_that_does_not_match(client, operator, team) -> None:  # type: ignore[no-untyped-def]
    client_id = registered(client)
    client.force_login(operator)
    _, challenge = pkce()
    params = approve(client, authorize_query(client_id, challenge), team)
    other_verifier, _ = pkce()

    response = exchange(client, client_id, params["code"], other_verifier)

    assert response.status_code == 400
    assert json.loads(response.content) == {
        "error": "invalid_grant",
        "error_description": "Code challenge failed.",
    }
    assert not OAuthToken.objects.exists()


@pytest.mark.parametrize(
    ("resource", "description"),
    [
        (None, f"The resource parameter is required: the MCP endpoint {PUBLIC_URL}/mcp"),
        (
            "https://other.example.com/mcp",
            f"This server issues tokens only for the resource {PUBLIC_URL}/mcp",
        ),
    ],
)
def test_the_exchange_needs_this_servers_resource(
    client, operator, team, resource, description
) -> None:  # type: ignore[no-untyped-def]
    client_id = registered(client)
    client.force_login(operator)
    verifier, challenge = pkce()
    params = approve(client, authorize_query(client_id, challenge), team)

    response = exchange(client, client_id, params["code"], verifier, resource=resource)

    assert response.status_code == 400
    assert json.loads(response.content) == {
        "error": "invalid_target",
        "error_description": description,
    }


def test_a_code_is_used_once_and_a_second_use_revokes_what_the_first_got(
    client, operator, team
) -> None:  # type: ignore[no-untyped-def]
    client_id = registered(client)
    client.force_login(operator)
    verifier, challenge = pkce()
    params = approve(client, authorize_query(client_id, challenge), team)
    first = json.loads(exchange(client, client_id, params["code"], verifier).content)

    again = exchange(client, client_id, params["code"], verifier)

    assert again.status_code == 400
    assert json.loads(again.content)["error"] == "invalid_grant"
    assert builtin.verify(first["access_token"]) is None
    assert OAuthToken.objects.get().revoked_at is not None


def test_an_expired_code_is_refused(client, operator, team) -> None:  # type: ignore[no-untyped-def]
    client_id = registered(client)
    client.force_login(operator)
    verifier, challenge = pkce()
    params = approve(client, authorize_query(client_id, challenge), team)
    OAuthCode.objects.update(expires_at=timezone.now() - timedelta(seconds=1))

    response = exchange(client, client_id, params["code"], verifier)

    assert json.loads(response.content)["error"] == "invalid_grant"


def test_another_app_cannot_exchange_the_code(client, operator, team) -> None:  # type: ignore[no-untyped-def]
    client_id = registered(client)
    intruder = registered(client, client_name="Intruder")
    client.force_login(operator)
    verifier, challenge = pkce()
    params = approve(client, authorize_query(client_id, challenge), team)

    response = exchange(client, intruder, params["code"], verifier)

    assert json.loads(response.content)["error"] == "invalid_grant"


# --- refresh, expiry, revocation ------------------------------------------------------------------


def test_a_refresh_rotates_the_refresh_token(client, operator, team) -> None:  # type: ignore[no-untyped-def]
    got = tokens_for(client, operator, team)

    response = refresh(client, got["client_id"], got["refresh_token"])

    assert response.status_code == 200, response.content
    new = json.loads(response.content)
    assert new["refresh_token"] != got["refresh_token"]
    assert builtin.verify(new["access_token"]) is not None
    old_again = refresh(client, got["client_id"], got["refresh_token"])
    assert old_again.status_code == 400
    assert json.loads(old_again.content)["error"] == "invalid_grant"
    # The spent refresh token came back: every token of the exchange is revoked.
    builtin.forget_cached()
    assert builtin.verify(new["access_token"]) is None
    assert refresh(client, got["client_id"], new["refresh_token"]).status_code == 400


def test_a_refresh_without_a_resource_keeps_the_tokens_resource(client, operator, team) -> None:  # type: ignore[no-untyped-def]
    got = tokens_for(client, operator, team)

    response = refresh(client, got["client_id"], got["refresh_token"], resource=None)

    assert response.status_code == 200
    assert OAuthToken.objects.order_by("pk").last().resource == PUBLIC_URL + "/mcp"  # type: ignore[union-attr]


def test_a_refresh_for_another_resource_is_refused(client, operator, team) -> None:  # type: ignore[no-untyped-def]
    got = tokens_for(client, operator, team)

    response = refresh(
        client, got["client_id"], got["refresh_token"], resource="https://x.example/mcp"
    )

    assert json.loads(response.content)["error"] == "invalid_target"


def test_an_expired_access_token_is_refused(client, operator, team) -> None:  # type: ignore[no-untyped-def]
    got = tokens_for(client, operator, team)
    OAuthToken.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    builtin.forget_cached()

    assert builtin.verify(got["access_token"]) is None
    assert Mcp(client, got["access_token"]).call("tools/list").status_code == 401


def test_a_token_for_another_resource_is_refused(client, operator, team, settings) -> None:  # type: ignore[no-untyped-def]
    got = tokens_for(client, operator, team)
    settings.TASKDESK_PUBLIC_URL = "https://elsewhere.example.com"
    builtin.forget_cached()

    assert builtin.verify(got["access_token"]) is None


def test_the_server_turned_off_accepts_none_of_its_tokens(client, operator, team, settings) -> None:  # type: ignore[no-untyped-def]
    got = tokens_for(client, operator, team)
    settings.TASKDESK_OAUTH_SERVER = False

    assert builtin.verify(got["access_token"]) is None
    assert client.get("/.well-known/oauth-authorization-server").status_code == 404
    assert client.post("/oauth/token", data="", content_type=FORM).status_code == 404


def test_the_revocation_endpoint_revokes_a_refresh_tokens_family(client, operator, team) -> None:  # type: ignore[no-untyped-def]
    got = tokens_for(client, operator, team)
    body = f"token={got['refresh_token']}&client_id={got['client_id']}"

    response = client.post("/oauth/revoke", data=body, content_type=FORM)

    assert response.status_code == 200
    assert response["Access-Control-Allow-Origin"] == "*"
    assert builtin.verify(got["access_token"]) is None
    assert refresh(client, got["client_id"], got["refresh_token"]).status_code == 400


def test_the_revocation_endpoint_revokes_an_access_token_with_its_refresh_token(
    client, operator, team
) -> None:  # type: ignore[no-untyped-def]
    got = tokens_for(client, operator, team)
    body = f"token={got['access_token']}&client_id={got['client_id']}"

    assert client.post("/oauth/revoke", data=body, content_type=FORM).status_code == 200

    assert builtin.verify(got["access_token"]) is None
    assert refresh(client, got["client_id"], got["refresh_token"]).status_code == 400


def test_the_revocation_endpoint_ignores_an_unknown_token(client) -> None:  # type: ignore[no-untyped-def]
    client_id = registered(client)
    body = f"token=tda_unknown&client_id={client_id}"

    assert client.post("/oauth/revoke", data=body, content_type=FORM).status_code == 200


def test_a_verified_token_marks_its_grant_used_at_most_once_a_minute(
    client, operator, team
) -> None:  # type: ignore[no-untyped-def]
    got = tokens_for(client, operator, team)
    grant = OAuthToken.objects.get().grant
    assert grant.last_used_at is None

    builtin.verify(got["access_token"])
    grant.refresh_from_db()
    first = grant.last_used_at
    builtin.forget_cached()
    builtin.verify(got["access_token"])
    grant.refresh_from_db()

    assert first is not None
    assert grant.last_used_at == first


def test_the_token_endpoint_answers_any_origin(client) -> None:  # type: ignore[no-untyped-def]
    preflight = client.options("/oauth/token", headers={"Origin": "https://app.example"})

    assert preflight.status_code == 204
    assert preflight["Access-Control-Allow-Origin"] == "*"
    assert "POST" in preflight["Access-Control-Allow-Methods"]
    answer = client.post("/oauth/token", data="grant_type=password", content_type=FORM)
    assert answer.status_code == 400
    assert answer["Access-Control-Allow-Origin"] == "*"
    assert json.loads(answer.content)["error"] == "unsupported_grant_type"
