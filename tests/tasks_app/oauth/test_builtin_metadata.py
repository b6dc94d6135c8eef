"""The built-in authorization server's metadata (RFC 8414)."""

from __future__ import annotations

import json

import pytest

from tests.tasks_app.oauth.builtin_flow import PUBLIC_URL

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _public_url(settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_PUBLIC_URL = PUBLIC_URL


def test_it_describes_the_server(client) -> None:  # type: ignore[no-untyped-def]
    response = client.get("/.well-known/oauth-authorization-server")

    assert response.status_code == 200
    assert response["Access-Control-Allow-Origin"] == "*"
    assert json.loads(response.content) == {
        "issuer": PUBLIC_URL,
        "authorization_endpoint": PUBLIC_URL + "/oauth/authorize",
        "token_endpoint": PUBLIC_URL + "/oauth/token",
        "registration_endpoint": PUBLIC_URL + "/oauth/register",
        "revocation_endpoint": PUBLIC_URL + "/oauth/revoke",
        "scopes_supported": ["tasks:call", "tasks:answer"],
        "response_types_supported": ["code"],
        "response_modes_supported": ["query"],
        "grant_types_supported": ["authorization_code", "refresh_token"],
        "token_endpoint_auth_methods_supported": [
            "none",
            "client_secret_basic",
            "client_secret_post",
        ],
        "revocation_endpoint_auth_methods_supported": [
            "none",
            "client_secret_basic",
            "client_secret_post",
        ],
        "code_challenge_methods_supported": ["S256"],
        "authorization_response_iss_parameter_supported": True,
        "client_id_metadata_document_supported": True,
    }


def test_it_validates_as_rfc8414_metadata(client) -> None:  # type: ignore[no-untyped-def]
    from authlib.oauth2 import rfc8414, rfc9207

    document = json.loads(client.get("/.well-known/oauth-authorization-server").content)

    rfc8414.AuthorizationServerMetadata(document).validate(
        metadata_classes=[rfc9207.AuthorizationServerMetadata]
    )


def test_the_protected_resource_names_it(client) -> None:  # type: ignore[no-untyped-def]
    document = json.loads(client.get("/.well-known/oauth-protected-resource/mcp").content)

    assert document["authorization_servers"][0] == PUBLIC_URL


def test_a_browser_preflight_is_answered(client) -> None:  # type: ignore[no-untyped-def]
    response = client.options(
        "/.well-known/oauth-authorization-server",
        headers={
            "Origin": "https://app.example",
            "Access-Control-Request-Headers": "mcp-protocol-version",
        },
    )

    assert response.status_code == 204
    assert response["Access-Control-Allow-Origin"] == "*"
    assert "MCP-Protocol-Version" in response["Access-Control-Allow-Headers"]


def test_the_openid_path_is_not_served(client) -> None:  # type: ignore[no-untyped-def]
    assert client.get("/.well-known/openid-configuration").status_code == 404


def test_it_is_gone_when_the_server_is_off(client, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_OAUTH_SERVER = False

    assert client.get("/.well-known/oauth-authorization-server").status_code == 404
    document = json.loads(client.get("/.well-known/oauth-protected-resource/mcp").content)
    assert PUBLIC_URL not in document["authorization_servers"]
