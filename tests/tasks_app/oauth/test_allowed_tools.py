"""A client narrowed to some tools (Client.allowed_tools) sees and calls only those, whatever
its token and wire."""

from __future__ import annotations

import pytest

from tasks_app.models import Client
from tasks_app.oauth.access import Access
from tests.tasks_app.mcp.conftest import Session
from tests.wire import error_of, request, result_of

pytestmark = pytest.mark.django_db

ALLOWED = ["greet", "slow_echo"]


@pytest.fixture
def narrowed(alice: Client) -> Client:
    alice.allowed_tools = ALLOWED
    alice.save(update_fields=["allowed_tools"])
    return alice


def names(result: dict) -> list[str]:
    return sorted(tool["name"] for tool in result["tools"])


def call(mcp, name: str):  # type: ignore[no-untyped-def]
    return mcp.post(request("tools/call", {"name": name, "arguments": {"name": "Ada"}}))


@pytest.fixture(params=["static", "oauth"])
def poster(request, narrowed):  # type: ignore[no-untyped-def]
    """Alice's MCP client with a static token, then with an external issuer's token."""
    return request.getfixturevalue("mcp" if request.param == "static" else "oauth_mcp")


def test_tools_list_shows_only_the_allowed_tools(poster) -> None:  # type: ignore[no-untyped-def]
    result = result_of(poster.call("tools/list"))

    assert names(result) == ALLOWED
    assert result["cacheScope"] == "private"  # this list is alice's own


def test_another_tool_answers_as_an_unknown_one(poster) -> None:  # type: ignore[no-untyped-def]
    allowed, other, unknown = (
        call(poster, "greet"),
        call(poster, "confirm_delete"),
        call(poster, "nope"),
    )

    assert result_of(allowed)["content"] == [{"type": "text", "text": "Hello, Ada!"}]
    assert other.status_code == unknown.status_code == 400
    assert error_of(other) == {
        "code": -32602,
        "message": "Unknown tool: confirm_delete",
        "data": {"name": "confirm_delete"},
    }
    assert error_of(unknown)["message"] == "Unknown tool: nope"


def test_the_handshake_wire_narrows_alike(poster) -> None:  # type: ignore[no-untyped-def]
    session = Session(poster)

    assert names(result_of(session.call("tools/list"))) == ALLOWED
    refused = session.call("tools/call", {"name": "confirm_delete", "arguments": {}})
    assert error_of(refused)["message"] == "Unknown tool: confirm_delete"
    assert result_of(session.call("tools/call", {"name": "greet", "arguments": {"name": "Ada"}}))


def test_an_unnarrowed_client_sees_every_tool_in_a_shared_list(mcp) -> None:  # type: ignore[no-untyped-def]
    result = result_of(mcp.call("tools/list"))

    assert {"greet", "confirm_delete", "slow_echo"} <= set(names(result))
    assert result["cacheScope"] == "public"


@pytest.mark.parametrize(
    ("client_tools", "token_tools", "allowed"),
    [
        ([], frozenset(), None),
        (["a", "b"], frozenset(), {"a", "b"}),
        ([], frozenset({"b"}), {"b"}),
        (["a", "b"], frozenset({"b", "c"}), {"b"}),
        ("a", frozenset(), set()),  # not a list: no tool rather than every tool
    ],
)
def test_the_token_narrows_the_client_further(client_tools, token_tools, allowed) -> None:  # type: ignore[no-untyped-def]
    access = Access(client=Client(name="c", allowed_tools=client_tools), scopes=frozenset(),
                    issuer="", tools=token_tools)  # fmt: skip

    assert access.allowed_tools() == allowed


# --- where an operator narrows a client -------------------------------------------------------


def test_the_admin_narrows_a_client_to_ticked_tools(admin_client, alice) -> None:  # type: ignore[no-untyped-def]
    page = admin_client.get(f"/admin/tasks_app/client/{alice.pk}/change/")
    assert b'value="confirm_delete"' in page.content

    response = admin_client.post(
        f"/admin/tasks_app/client/{alice.pk}/change/",
        {"name": "alice", "tenant": alice.tenant_id, "allowed_tools": ["greet", "slow_echo"]},
    )

    assert response.status_code == 302, response.content
    alice.refresh_from_db()
    assert alice.allowed_tools == ["greet", "slow_echo"]
    assert b"greet, slow_echo" in admin_client.get("/admin/tasks_app/client/").content


def test_the_admin_refuses_a_tool_that_does_not_exist(admin_client, alice) -> None:  # type: ignore[no-untyped-def]
    response = admin_client.post(
        f"/admin/tasks_app/client/{alice.pk}/change/",
        {"name": "alice", "tenant": alice.tenant_id, "allowed_tools": ["no_such_tool"]},
    )

    assert response.status_code == 200
    assert b"Select a valid choice" in response.content
    alice.refresh_from_db()
    assert alice.allowed_tools == []


def test_create_client_token_narrows_the_client(db) -> None:  # type: ignore[no-untyped-def]
    from io import StringIO

    from django.core.management import call_command

    def create(*extra: str) -> None:
        call_command("create_client_token", "--client", "ci-bot", "--tenant", "acme", *extra,
                     stdout=StringIO(), stderr=StringIO())  # fmt: skip

    create("--tools", "greet, slow_echo")
    assert Client.objects.get(name="ci-bot").allowed_tools == ["greet", "slow_echo"]
    create()  # another token leaves the tools as they are
    assert Client.objects.get(name="ci-bot").allowed_tools == ["greet", "slow_echo"]
    create("--tools", "")
    assert Client.objects.get(name="ci-bot").allowed_tools == []
