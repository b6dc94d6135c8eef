"""Signing in with OAuth, end to end, with clients nobody here wrote: the official TypeScript
SDK 1.32.2 (``StreamableHTTPClientTransport`` with an ``OAuthClientProvider``,
tests/clients/node/oauth.mjs) and the official Python SDK 2.3 (``OAuthClientProvider`` on its
HTTP client), against a live stack (web, worker, beat) and its built-in authorization server,
with a person logging in and approving in Chromium.

Each client connects with no token, is told where to look (401 and the resource metadata),
discovers the authorization server, gets a ``client_id`` (a client ID metadata document, or
dynamic registration), sends the person to the consent page, receives the code on its own
loopback redirect URI, exchanges it and calls ``export_report`` as a task to completion; the
task's page and the dashboard list then show the app and the person.

Both SDKs accept only an https URL as a client ID metadata document's address (the MCP
specification says so), so the documents are served over https on 127.0.0.1 with a
certificate made here, which the stack trusts through ``SSL_CERT_FILE``; nothing else is bent
for them. ``TASKDESK_OAUTH_ALLOW_LOOPBACK_CLIENTS`` lets the stack fetch a document from a
loopback address.

One stack and one Chromium for the module; the cases run one after another.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from mcp.client.auth import OAuthClientProvider
from mcp.shared.auth import OAuthClientMetadata

from tests.integration.oauth_clients import (
    EXPORT,
    WAIT,
    Documents,
    Memory,
    NodeClient,
    PythonSdk,
    Redirects,
    redirect_uri,
)
from tests.integration.test_inbox_browser import Browser
from tests.integration.test_sdk_client import text
from tests.live import LiveStack, free_port
from tests.services import CHROMIUM_ARGS, chromium_path

pytestmark = [pytest.mark.browser, pytest.mark.live]

PASSWORD = "pw-petra-1"  # Petra's (``person``)
# What the consent page says of an app, by how it got its client_id.
FROM_DOCUMENT = "It describes itself in a document at 127.0.0.1."
SELF_REGISTERED = "It registered itself: Taskdesk has not checked who made it."


@pytest.fixture(scope="module")
def documents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Documents]:
    host = Documents(tmp_path_factory.mktemp("documents"))
    yield host
    host.close()


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker, documents) -> Iterator[LiveStack]:  # type: ignore[no-untyped-def]
    env = {
        "TASKDESK_OAUTH_ALLOW_LOOPBACK_CLIENTS": "1",
        # The documents' certificate is the only one the stack trusts: it fetches nothing else.
        "SSL_CERT_FILE": documents.ca_file,
    }
    running = LiveStack(env=env)
    running.env["TASKDESK_PUBLIC_URL"] = running.url  # the issuer and the resource's base
    try:
        with django_db_blocker.unblock():
            yield running.start()
    finally:
        running.close(graceful=False)


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS
        )
        yield launched
        launched.close()


@pytest.fixture
def browser(chromium) -> Iterator[Browser]:  # type: ignore[no-untyped-def]
    opened = Browser(chromium)
    yield opened
    opened.close()


@pytest.fixture(scope="module", autouse=True)
def _orm_beside_playwright() -> Iterator[None]:
    # Playwright's sync API runs an event loop in this thread; the ORM calls between browser
    # steps are ordinary blocking calls, which Django refuses there by default.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        yield


@pytest.fixture
def person(transactional_db, django_user_model, settings):  # type: ignore[no-untyped-def]
    """Petra, an operator of two tenants (acme and initech): she may connect apps to either."""
    from tasks_app.models import Tenant
    from tasks_app.operators import grant_role

    # The live server checks passwords with the production hashers, not the tests' MD5.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.PBKDF2PasswordHasher"]
    user = django_user_model.objects.create_user(username="petra", password=PASSWORD)
    for slug in ("acme", "initech"):
        Tenant.objects.get_or_create(slug=slug)[0].members.add(user)
    grant_role(user, "operator")
    return user


# --- the person, in Chromium ------------------------------------------------------------------


def consent(
    browser: Browser, stack: LiveStack, url: str, *, app: str, says: str, tenant: str,
    decision: str,
) -> Any:  # fmt: skip
    """Open the authorization URL a client printed, log in as Petra, check that the consent
    page names APP and SAYS how it is known, choose TENANT and answer (``approve`` or
    ``deny``); return the page, back at the client's redirect URI."""
    from playwright.sync_api import expect

    page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
    page.goto(url)
    assert page.url.startswith(f"{stack.url}/accounts/login/?next=/oauth/authorize%3F")
    page.get_by_label("Username").fill("petra")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{stack.url}/oauth/authorize?**")
    expect(page.get_by_role("heading", level=1)).to_have_text(f"Connect {app} to Taskdesk?")
    expect(page.locator(".lede")).to_contain_text(says)
    expect(page.locator("#loopback-warning")).to_be_visible()
    page.get_by_label(tenant, exact=True).check()
    page.locator(f"#{decision}").click()
    page.wait_for_url("http://127.0.0.1:*/callback?**")
    return page


def shows_the_origin(page: Any, stack: LiveStack, task_id: str, app: str) -> None:
    """The task's page and the dashboard list name the app and Petra."""
    from playwright.sync_api import expect

    page.goto(f"{stack.url}/tasks/{task_id}/")
    expect(page.locator("#task-origin")).to_have_text(f"{app}, connected by petra")
    page.goto(f"{stack.url}/tasks/")
    expect(page.locator(f"#row-{task_id}")).to_contain_text(f"{app} · petra")


def started_by(task_id: str, person: Any, app: str, tenant: str, kind: str) -> Any:
    """The one task there is: TASK_ID, completed, recorded as started by APP (an app of KIND)
    connected by PERSON to TENANT; return the app's row."""
    from tasks_app.models import Status, Task, TaskOrigin

    task = Task.objects.select_related("client__tenant").get()
    assert (str(task.pk), task.status) == (task_id, Status.COMPLETED)
    origin = TaskOrigin.objects.select_related("grant__app").get(task=task)
    assert (origin.app, origin.person, origin.person_name) == (app, person, "petra")
    assert origin.grant is not None
    assert (origin.grant.tenant.slug, task.client.tenant.slug) == (tenant, tenant)
    assert origin.grant.app.kind == kind
    return origin.grant.app


# --- the TypeScript SDK -----------------------------------------------------------------------


@pytest.fixture
def node_clients() -> Iterator[list[NodeClient]]:
    """The scripts a test starts (add them), killed at its end if they are still running."""
    started: list[NodeClient] = []
    yield started
    for client in started:
        client.close()


def node_export(node: NodeClient, browser: Browser, stack: LiveStack, app: str, says: str) -> Any:
    """Drive NODE through Petra's approval (for initech) to the end of its export; return the
    browser page (Petra signed in) and the task's id."""
    url = node.next("authorize")["url"]
    page = consent(browser, stack, url, app=app, says=says, tenant="initech", decision="approve")
    assert page.locator("#outcome").inner_text().startswith("Signed in")
    params = node.next("callback")["params"]
    assert (params["code"], params["iss"]) == ("<code>", stack.url)
    assert node.next("authorized") == {
        "event": "authorized",
        "tokenType": "Bearer",
        "scope": "tasks:call tasks:answer",
        "accessPrefix": "tda_",
        "refreshPrefix": "tdr_",
    }
    assert node.next("connected")["protocolVersion"] == "2025-11-25"
    task_id = str(node.next("task")["taskId"])
    result = node.next("result")["result"]
    assert not result.get("isError"), result
    assert result["structuredContent"]["rows"] == EXPORT["rows"]
    assert node.next("done") == {"event": "done", "tokens": True, "completed": True}
    assert node.finish().startswith("exit status 0;")
    # The sign-in ran inside the refused connect: the SDK got its client_id and printed the
    # authorization URL, then connect() failed with UnauthorizedError.
    assert node.events()[:5] == ["client", "authorize", "unauthorized", "callback", "authorized"]
    return page, task_id


def test_the_typescript_sdk_signs_in_with_a_client_id_metadata_document(  # type: ignore[no-untyped-def]
    stack, browser, documents, person, node_clients
) -> None:
    app, port = "Acme Desk (TypeScript)", free_port()
    client_id = documents.app(app, redirect_uri(port))
    node = NodeClient(stack, app, port, client_metadata_url=client_id)
    node_clients.append(node)

    page, task_id = node_export(node, browser, stack, app, FROM_DOCUMENT)

    assert node.seen[0] == {"event": "client", "clientId": client_id, "hasSecret": False}
    row = started_by(task_id, person, app, "initech", "document")
    assert row.client_id == client_id
    assert documents.fetches.count(client_id.removeprefix(documents.base)) == 1
    shows_the_origin(page, stack, task_id, app)


def test_the_typescript_sdk_registers_itself_and_signs_in(  # type: ignore[no-untyped-def]
    stack, browser, person, node_clients
) -> None:
    app, port = "Acme Desk (TS, registered)", free_port()
    node = NodeClient(stack, app, port)
    node_clients.append(node)

    page, task_id = node_export(node, browser, stack, app, SELF_REGISTERED)

    client_id = node.seen[0]["clientId"]
    assert node.seen[0] == {"event": "client", "clientId": client_id, "hasSecret": False}
    row = started_by(task_id, person, app, "initech", "dynamic")
    assert (row.client_id, row.redirect_uris) == (client_id, [redirect_uri(port)])
    shows_the_origin(page, stack, task_id, app)


def test_a_person_who_denies_leaves_the_typescript_sdk_without_a_token(  # type: ignore[no-untyped-def]
    stack, browser, person, node_clients
) -> None:
    from tasks_app.models import OAuthGrant, OAuthToken, Task

    app, port = "Acme Desk (TS, denied)", free_port()
    node = NodeClient(stack, app, port)
    node_clients.append(node)
    url = node.next("authorize")["url"]

    page = consent(
        browser, stack, url, app=app, says=SELF_REGISTERED, tenant="initech", decision="deny"
    )

    assert page.locator("#outcome").inner_text().startswith("Not signed in")
    params = node.next("callback")["params"]
    params.pop("state")  # checked by the script: its own
    assert params == {
        "error": "access_denied",
        "error_description": "The resource owner or authorization server denied the request",
        "iss": stack.url,
    }
    assert node.next("denied") == {
        "event": "denied",
        "error": "access_denied",
        "description": "The resource owner or authorization server denied the request",
    }
    assert node.next("done") == {"event": "done", "tokens": False}
    assert node.finish().startswith("exit status 0;")
    assert not OAuthGrant.objects.exists()
    assert not OAuthToken.objects.exists()
    assert not Task.objects.exists()


# --- the Python SDK ---------------------------------------------------------------------------


@pytest.fixture
def redirects() -> Iterator[Redirects]:
    server = Redirects()
    yield server
    server.close()


def test_the_python_sdk_signs_in_with_a_client_id_metadata_document(  # type: ignore[no-untyped-def]
    stack, browser, documents, person, redirects
) -> None:
    app = "Acme Notebook (Python)"
    client_id = documents.app(app, redirects.uri)
    sdk = PythonSdk(stack, app, client_id, redirects)
    sdk.start()
    url = sdk.authorization_url()

    page = consent(
        browser, stack, url, app=app, says=FROM_DOCUMENT, tenant="initech", decision="approve"
    )

    assert page.locator("#outcome").inner_text() == "Signed in"
    sdk.join(2 * WAIT)
    assert not sdk.is_alive(), "the Python SDK did not finish its export"
    if sdk.error is not None:
        raise sdk.error
    assert sdk.protocol_version == "2026-07-28"
    assert sdk.result is not None and not sdk.result.is_error
    assert text(sdk.result).startswith(f"Exported {EXPORT['rows']} rows of Q3 as csv")
    assert sdk.storage.client_info is not None and sdk.storage.tokens is not None
    assert sdk.storage.client_info.client_id == client_id
    assert sdk.storage.tokens.access_token.startswith("tda_")
    [task_id] = sdk.tasks.task_ids
    assert sdk.tasks.seen_statuses[-1] == "completed"
    row = started_by(task_id, person, app, "initech", "document")
    assert row.client_id == client_id
    shows_the_origin(page, stack, task_id, app)


# --- why the documents are served over https ------------------------------------------------


def test_both_sdks_take_only_an_https_document_address(stack, node_clients) -> None:  # type: ignore[no-untyped-def]
    # Why the documents above are served over https: Taskdesk would fetch one over http on
    # loopback (TASKDESK_OAUTH_ALLOW_LOOPBACK_CLIENTS), but neither SDK sends such a client_id.
    plain = "http://127.0.0.1:9/apps/client.json"
    node = NodeClient(stack, "Plain", free_port(), client_metadata_url=plain)
    node_clients.append(node)

    ended = node.finish()

    assert ended.startswith("exit status 1; lines [];")
    assert (
        "clientMetadataUrl must be a valid HTTPS URL with a non-root pathname, got: " + plain
    ) in ended
    metadata = OAuthClientMetadata(redirect_uris=[redirect_uri(9)])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="client_metadata_url must be a valid HTTPS URL"):
        OAuthClientProvider(stack.mcp_url, metadata, Memory(), client_metadata_url=plain)
