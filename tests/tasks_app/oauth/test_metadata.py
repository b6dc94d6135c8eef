"""The protected-resource metadata of /mcp (RFC 9728) at both of its addresses."""

from __future__ import annotations

import json

import pytest

from config.env import OAuthIssuer
from tests.tasks_app.oauth.conftest import PUBLIC_URL, RESOURCE

pytestmark = pytest.mark.django_db

PATHS = ["/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource"]


@pytest.fixture(autouse=True)
def _public_url(settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_PUBLIC_URL = PUBLIC_URL
    settings.TASKDESK_OAUTH_SERVER = True
    settings.TASKDESK_OAUTH_ISSUERS = ()


@pytest.mark.parametrize("path", PATHS)
def test_it_describes_the_mcp_endpoint_at_both_addresses(client, path) -> None:  # type: ignore[no-untyped-def]
    response = client.get(path)

    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert json.loads(response.content) == {
        "resource": RESOURCE,
        "authorization_servers": [PUBLIC_URL],
        "scopes_supported": ["tasks:call", "tasks:answer"],
        "bearer_methods_supported": ["header"],
        "resource_name": "Taskdesk",
    }
    assert response["Access-Control-Allow-Origin"] == "*"
    assert response["Cache-Control"] == "public, max-age=3600"


def test_the_resource_is_the_canonical_uri_of_the_public_url(client, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_PUBLIC_URL = "HTTPS://Taskdesk.Example.COM:443/"

    document = json.loads(client.get(PATHS[0]).content)

    assert document["resource"] == RESOURCE
    assert document["authorization_servers"] == ["HTTPS://Taskdesk.Example.COM:443"]


def test_it_names_the_external_issuers_after_the_built_in_server(client, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_OAUTH_ISSUERS = (
        OAuthIssuer(issuer="https://id.example.com/realms/acme", create_clients=True,
                    tenant_claim="tenant"),
    )  # fmt: skip

    document = json.loads(client.get(PATHS[0]).content)
    assert document["authorization_servers"] == [PUBLIC_URL, "https://id.example.com/realms/acme"]

    settings.TASKDESK_OAUTH_SERVER = False
    document = json.loads(client.get(PATHS[0]).content)
    assert document["authorization_servers"] == ["https://id.example.com/realms/acme"]


def test_it_answers_the_cors_preflight_of_browser_clients(client) -> None:  # type: ignore[no-untyped-def]
    response = client.options(
        PATHS[0],
        headers={
            "Origin": "https://app.example.org",
            "Access-Control-Request-Method": "GET",
            "Access-Control-Request-Headers": "mcp-protocol-version",
        },
    )

    assert response.status_code == 204
    assert response["Access-Control-Allow-Origin"] == "*"
    assert response["Access-Control-Allow-Methods"] == "GET, OPTIONS"
    assert response["Access-Control-Allow-Headers"] == "MCP-Protocol-Version"


def test_it_refuses_other_methods(client) -> None:  # type: ignore[no-untyped-def]
    assert client.post(PATHS[0]).status_code == 405


def test_it_is_served_on_the_public_host_with_production_settings(client, settings) -> None:  # type: ignore[no-untyped-def]
    settings.ALLOWED_HOSTS = ["taskdesk.example.com"]
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

    response = client.get(
        PATHS[0], headers={"Host": "taskdesk.example.com", "X-Forwarded-Proto": "https"}
    )

    assert response.status_code == 200
    assert json.loads(response.content)["resource"] == RESOURCE
    assert not response.cookies  # no session or CSRF cookie for a metadata fetch
