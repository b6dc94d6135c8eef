"""Dynamic client registration (RFC 7591) at /oauth/register."""

from __future__ import annotations

import json

import pytest

from tasks_app.models import OAuthApp
from tasks_app.oauth import builtin
from tests.tasks_app.oauth.builtin_flow import PUBLIC_URL, REDIRECT_URI, register

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _public_url(settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_PUBLIC_URL = PUBLIC_URL


def test_a_public_app_registers_itself(client) -> None:  # type: ignore[no-untyped-def]
    response = register(client)

    assert response.status_code == 201
    assert response["Access-Control-Allow-Origin"] == "*"
    body = json.loads(response.content)
    assert body["client_id"].startswith("tdapp_")
    assert "client_secret" not in body
    assert body["redirect_uris"] == [REDIRECT_URI]
    assert body["token_endpoint_auth_method"] == "none"
    assert body["client_name"] == "Claude Desktop"
    app = OAuthApp.objects.get(client_id=body["client_id"])
    assert app.kind == OAuthApp.Kind.DYNAMIC
    assert app.client_secret_hash == ""


def test_an_app_that_omits_its_auth_method_is_public(client) -> None:  # type: ignore[no-untyped-def]
    body = json.loads(register(client, token_endpoint_auth_method=None).content)

    assert body["token_endpoint_auth_method"] == "none"
    assert "client_secret" not in body


def test_a_confidential_app_gets_a_secret_kept_as_a_hash(client) -> None:  # type: ignore[no-untyped-def]
    body = json.loads(register(client, token_endpoint_auth_method="client_secret_post").content)

    app = OAuthApp.objects.get(client_id=body["client_id"])
    assert app.client_secret_hash == builtin.hash_secret(body["client_secret"])


@pytest.mark.parametrize(
    "uri",
    [
        "http://127.0.0.1:5000/cb",
        "http://localhost/cb",
        "http://[::1]:8080/cb",
        "https://app.example/cb",
        "com.example.app:/oauth",
    ],
)
def test_it_accepts_https_loopback_and_native_redirect_uris(client, uri) -> None:  # type: ignore[no-untyped-def]
    assert register(client, redirect_uris=[uri]).status_code == 201


@pytest.mark.parametrize(
    ("uri", "why"),
    [
        ("http://app.example/cb", "must use https (http only to a loopback host)"),
        ("https://app.example/cb#frag", "may not have a fragment"),
        ("javascript:alert(1)", "uses a refused scheme"),
        ("/relative/cb", "is not an absolute URI"),
    ],
)
def test_it_refuses_unsafe_redirect_uris(client, uri, why) -> None:  # type: ignore[no-untyped-def]
    response = register(client, redirect_uris=[uri])

    assert response.status_code == 400
    body = json.loads(response.content)
    assert body["error"] == "invalid_redirect_uri"
    assert why in body["error_description"]
    assert not OAuthApp.objects.exists()


def test_it_refuses_a_registration_without_redirect_uris(client) -> None:  # type: ignore[no-untyped-def]
    response = register(client, redirect_uris=None)

    assert response.status_code == 400
    assert json.loads(response.content)["error"] == "invalid_redirect_uri"


def test_it_refuses_a_body_that_is_not_an_object(client) -> None:  # type: ignore[no-untyped-def]
    response = client.post("/oauth/register", data="[1]", content_type="application/json")

    assert response.status_code == 400
    assert json.loads(response.content) == {
        "error": "invalid_client_metadata",
        "error_description": "The body must be a JSON object.",
    }


def test_an_address_registers_a_bounded_number_of_apps_an_hour(client, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_OAUTH_REGISTRATIONS_PER_HOUR = 2

    assert register(client).status_code == 201
    assert register(client).status_code == 201
    refused = register(client)

    assert refused.status_code == 429
    assert refused["Retry-After"] == "3600"
    assert json.loads(refused.content)["error"] == "slow_down"
    assert OAuthApp.objects.count() == 2
