"""The 401 and 403 answers of /mcp and their WWW-Authenticate challenges, on both wires."""

from __future__ import annotations

import json

import pytest

from tasks_app.mcp import scopes
from tasks_app.mcp.handlers.handshake import QUESTION_ID_PREFIX
from tasks_app.mcp.methods import handshake_methods, methods
from tests.tasks_app.mcp.conftest import Mcp, Session
from tests.tasks_app.oauth.conftest import INVALID_CHALLENGE, METADATA_URL, PUBLIC_URL
from tests.wire import SESSION_HEADER, request, result_of

pytestmark = pytest.mark.django_db

MISSING = f'Bearer resource_metadata="{METADATA_URL}", scope="tasks:call tasks:answer"'
INVALID = INVALID_CHALLENGE


def insufficient(scope: str) -> str:
    return f'Bearer error="insufficient_scope", scope="{scope}", resource_metadata="{METADATA_URL}"'


@pytest.fixture(autouse=True)
def _public_url(settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_PUBLIC_URL = PUBLIC_URL


# --- 401 -------------------------------------------------------------------------------------


@pytest.mark.parametrize("authorization", [None, "Bearer", "Basic YTpi"])
def test_a_request_without_a_bearer_token_is_told_where_to_get_one(mcp, authorization) -> None:  # type: ignore[no-untyped-def]
    response = mcp.post(request("tools/list"), token=None, headers={"Authorization": authorization})

    assert response.status_code == 401
    assert response["WWW-Authenticate"] == MISSING
    body = json.loads(response.content)
    assert body["error"]["code"] == -32600


def test_a_missing_token_keeps_the_jsonrpc_body(mcp) -> None:  # type: ignore[no-untyped-def]
    body = json.loads(mcp.post(request("tools/list"), token=None).content)

    assert body == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {
            "code": -32600,
            "message": "Authentication required: send Authorization: Bearer <token>",
        },
    }


@pytest.mark.parametrize("token", ["tdk_wrong", "tda_unknown", "eyJhbGciOiJub25lIn0.e30.", "x"])
def test_a_refused_token_is_invalid_token_and_nothing_more(mcp, token) -> None:  # type: ignore[no-untyped-def]
    response = mcp.post(request("tools/list"), token=token)

    assert response.status_code == 401
    assert response["WWW-Authenticate"] == INVALID
    assert json.loads(response.content)["error"] == {
        "code": -32600,
        "message": "The bearer token is unknown or revoked",
    }


def test_a_handshake_client_gets_the_same_challenge(mcp) -> None:  # type: ignore[no-untyped-def]
    from tests.wire import handshake_headers, initialize

    response = mcp.post(initialize(), token=None, headers=handshake_headers(None, None))

    assert response.status_code == 401
    assert response["WWW-Authenticate"] == MISSING


# --- 403 -------------------------------------------------------------------------------------


def test_a_token_without_tasks_answer_cannot_answer_a_question(call_only_mcp) -> None:  # type: ignore[no-untyped-def]
    body = request("tasks/update", {"taskId": "t-1", "inputResponses": {}}, tasks=True, id=7)

    response = call_only_mcp.post(body)

    assert response.status_code == 403
    assert response["WWW-Authenticate"] == insufficient("tasks:answer")
    assert json.loads(response.content) == {
        "jsonrpc": "2.0",
        "id": 7,
        "error": {
            "code": -32600,
            "message": "The access token lacks the scope tasks:answer, which tasks/update needs",
            "data": {"requiredScope": "tasks:answer"},
        },
    }


def test_the_same_token_may_call_tools_and_follow_tasks(call_only_mcp) -> None:  # type: ignore[no-untyped-def]
    assert result_of(call_only_mcp.call("tools/list"))["tools"]
    response = call_only_mcp.call("tasks/get", {"taskId": "t-1"}, tasks=True)
    assert response.status_code == 400  # an unknown task, not a scope refusal


def test_a_token_without_tasks_call_cannot_list_tools(client, keycloak, alice) -> None:  # type: ignore[no-untyped-def]
    answer_only = Mcp(client, keycloak.token(scope="tasks:answer"))

    response = answer_only.call("tools/list")

    assert response.status_code == 403
    assert response["WWW-Authenticate"] == insufficient("tasks:call")


def test_a_handshake_client_without_tasks_answer_cannot_answer_a_task_question(
    call_only_mcp,
) -> None:  # type: ignore[no-untyped-def]
    session = Session(call_only_mcp)
    reply = {"jsonrpc": "2.0", "id": f"{QUESTION_ID_PREFIX}t-1:confirm", "result": {}}

    response = session.post(reply)

    assert response.status_code == 403
    assert response["WWW-Authenticate"] == insufficient("tasks:answer")
    # Its other traffic is tasks:call's: the session works.
    assert result_of(session.call("tools/list"))["tools"]


def test_a_handshake_client_with_tasks_answer_may_answer(oauth_mcp) -> None:  # type: ignore[no-untyped-def]
    session = Session(oauth_mcp)
    reply = {"jsonrpc": "2.0", "id": f"{QUESTION_ID_PREFIX}t-1:confirm", "result": {}}

    assert session.post(reply).status_code == 202


def test_the_session_stream_needs_tasks_call(client, keycloak, alice) -> None:  # type: ignore[no-untyped-def]
    both = Session(Mcp(client, keycloak.token()))
    answer_only = keycloak.token(scope="tasks:answer")

    response = client.get(
        "/mcp",
        headers={
            "Authorization": f"Bearer {answer_only}",
            SESSION_HEADER: both.id,
            "Accept": "text/event-stream",
        },
    )

    assert response.status_code == 403
    assert response["WWW-Authenticate"] == insufficient("tasks:call")


# --- the table ------------------------------------------------------------------------------


def test_every_method_of_both_wires_has_its_scope() -> None:
    # initialize is the handshake era's own, outside its method table.
    served = methods.names() | handshake_methods.names() | {"initialize"}
    assert served == set(scopes.METHOD_SCOPES)


@pytest.mark.parametrize(
    ("message", "scope"),
    [
        ({"method": "tasks/update"}, "tasks:answer"),
        ({"method": "tools/call"}, "tasks:call"),
        ({"method": "no/such"}, "tasks:call"),
        ({"method": "notifications/initialized"}, "tasks:call"),
        ({"id": f"{QUESTION_ID_PREFIX}t:k", "result": {}}, "tasks:answer"),
        ({"id": "taskdesk-s:round:k", "result": {}}, "tasks:call"),
        ({"id": 3, "result": {}}, "tasks:call"),
    ],
)
def test_the_scope_of_each_message(message, scope) -> None:  # type: ignore[no-untyped-def]
    assert scopes.needed({"jsonrpc": "2.0", **message}) == scope
