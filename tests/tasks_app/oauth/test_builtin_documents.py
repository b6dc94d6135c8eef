"""Client ID metadata documents: an https URL as client_id, fetched, checked and cached.

The documents are served over real HTTP on 127.0.0.1, which TASKDESK_OAUTH_ALLOW_LOOPBACK_CLIENTS
allows (over http too); the tests of private addresses never connect anywhere.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from tasks_app.authserver import documents
from tasks_app.models import OAuthApp
from tasks_app.oauth import builtin
from tests.tasks_app.mcp.conftest import Mcp
from tests.tasks_app.oauth.builtin_flow import (
    PUBLIC_URL,
    REDIRECT_URI,
    approve,
    authorize_query,
    document_host,
    exchange,
    pkce,
)
from tests.wire import result_of

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def host():  # type: ignore[no-untyped-def]
    with document_host() as served:
        yield served


@pytest.fixture(autouse=True)
def _settings(settings, host) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_PUBLIC_URL = PUBLIC_URL
    settings.TASKDESK_OAUTH_ALLOW_LOOPBACK_CLIENTS = True
    host.fetches.clear()
    builtin.forget_cached()


def _page(client, operator, client_id, **overrides):  # type: ignore[no-untyped-def]
    client.force_login(operator)
    _, challenge = pkce()
    return client.get(f"/oauth/authorize?{authorize_query(client_id, challenge, **overrides)}")


def test_a_document_app_signs_in_and_gets_a_working_token(client, operator, alice, host) -> None:  # type: ignore[no-untyped-def]
    client_id = host.app("/flow.json", client_name="Cursor")
    client.force_login(operator)
    verifier, challenge = pkce()

    page = client.get(f"/oauth/authorize?{authorize_query(client_id, challenge)}")
    assert b"Connect Cursor to Taskdesk?" in page.content
    params = approve(client, authorize_query(client_id, challenge), alice.tenant)
    response = exchange(client, client_id, params["code"], verifier)

    assert response.status_code == 200, response.content
    token = json.loads(response.content)["access_token"]
    assert result_of(Mcp(client, token).call("tools/list"))["tools"]
    app = OAuthApp.objects.get(client_id=client_id)
    assert (app.kind, app.name, app.redirect_uris) == ("document", "Cursor", [REDIRECT_URI])


def test_the_document_is_cached_for_its_max_age(client, operator, host) -> None:  # type: ignore[no-untyped-def]
    client_id = host.app("/cached.json")
    host.headers["/cached.json"] = {"Cache-Control": "public, max-age=600"}

    assert _page(client, operator, client_id).status_code == 200
    assert _page(client, operator, client_id).status_code == 200

    assert host.fetches["/cached.json"] == 1
    app = OAuthApp.objects.get(client_id=client_id)
    assert app.fresh_until - app.fetched_at == timedelta(seconds=600)  # type: ignore[operator]


@pytest.mark.parametrize(
    ("header", "fresh"),
    [
        ("", documents.DEFAULT_FRESH),
        ("no-store", documents.DEFAULT_FRESH),
        ("max-age=5", documents.MIN_FRESH),
        ("public, max-age=31536000", documents.MAX_FRESH),
        ("max-age=120", timedelta(minutes=2)),
    ],
)
def test_max_age_is_kept_within_bounds(header, fresh) -> None:  # type: ignore[no-untyped-def]
    assert documents.fresh_for(header) == fresh


def test_it_refuses_a_redirect_uri_not_in_the_document(client, operator, host) -> None:  # type: ignore[no-untyped-def]
    client_id = host.app("/strict.json")

    response = _page(client, operator, client_id, redirect_uri="http://127.0.0.1:9999/other")

    assert response.status_code == 400  # told to the person, never redirected
    assert (
        b"Redirect URI http://127.0.0.1:9999/other is not supported by client." in response.content
    )


@pytest.mark.parametrize(
    ("document", "reason"),
    [
        (
            {
                "client_id": "https://elsewhere.example/c.json",
                "client_name": "X",
                "redirect_uris": [REDIRECT_URI],
            },
            "The client_id in the metadata document is not its URL.",
        ),
        ({"client_name": "X"}, "The client_id in the metadata document is not its URL."),
        (
            {"client_id": None, "redirect_uris": [REDIRECT_URI]},
            "The client metadata document has no client_name.",
        ),
        (
            {"client_id": None, "client_name": "X"},
            "The client metadata document has no redirect_uris.",
        ),
        (
            {"client_id": None, "client_name": "X", "redirect_uris": ["http://evil.example/cb"]},
            "The client metadata document: the redirect URI &#x27;http://evil.example/cb&#x27; must use https (http only to a loopback host)",
        ),
    ],
)
def test_it_refuses_an_invalid_document(client, operator, host, document, reason) -> None:  # type: ignore[no-untyped-def]
    path = f"/bad-{abs(hash(json.dumps(document)))}.json"
    url = host.url(path)
    host.publish(
        path, {k: (url if k == "client_id" and v is None else v) for k, v in document.items()}
    )

    response = _page(client, operator, url)

    assert response.status_code == 400
    assert reason.encode() in response.content
    assert not OAuthApp.objects.filter(client_id=url).exists()


def test_it_refuses_an_oversize_document(client, operator, host) -> None:  # type: ignore[no-untyped-def]
    url = host.url("/big.json")
    host.publish(
        "/big.json", {"client_id": url, "client_name": "x" * 6000, "redirect_uris": [REDIRECT_URI]}
    )

    response = _page(client, operator, url)

    assert response.status_code == 400
    assert b"The client metadata document is larger than 5120 bytes." in response.content


def test_it_refuses_a_document_that_is_not_json(client, operator, host) -> None:  # type: ignore[no-untyped-def]
    url = host.publish("/text.json", b"<html>hello</html>")

    assert b"The client metadata document is not JSON." in _page(client, operator, url).content


def test_it_refuses_a_missing_document(client, operator, host) -> None:  # type: ignore[no-untyped-def]
    response = _page(client, operator, host.url("/missing.json"))

    assert b"The client_id URL answered HTTP 404, not 200." in response.content


def test_it_refuses_a_client_id_url_without_a_path(client, operator, host) -> None:  # type: ignore[no-untyped-def]
    response = _page(client, operator, host.base + "/")

    assert b"A client_id URL must have a path, such as /client.json." in response.content


@pytest.mark.parametrize(
    ("url", "address"),
    [
        ("https://10.0.0.1/client.json", "10.0.0.1"),
        ("https://169.254.169.254/client.json", "169.254.169.254"),
        ("https://localhost:9/client.json", "127.0.0.1"),
    ],
)
def test_it_never_fetches_from_private_addresses(client, operator, settings, url, address) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_OAUTH_ALLOW_LOOPBACK_CLIENTS = False

    response = _page(client, operator, url)

    assert response.status_code == 400
    assert f"resolves to {address}, a private or special address".encode() in response.content
    # The refusal names the setting that matters here, not the webhooks' one.
    assert b"TASKDESK_OAUTH_ALLOW_LOOPBACK_CLIENTS" in response.content
    assert b"TASKDESK_WEBHOOK" not in response.content


def test_without_the_loopback_setting_an_http_client_id_is_not_a_document(
    client, operator, settings, host
) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_OAUTH_ALLOW_LOOPBACK_CLIENTS = False
    client_id = host.app("/plain.json")

    response = _page(client, operator, client_id)

    assert response.status_code == 400
    assert b"The client does not exist on this server." in response.content
    assert host.fetches["/plain.json"] == 0
