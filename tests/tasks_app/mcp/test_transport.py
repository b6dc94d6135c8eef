"""The HTTP transport of /mcp: every bad input gets its HTTP status and JSON-RPC code."""

from __future__ import annotations

import base64
import json

import pytest

from tasks_app import tokens
from tasks_app.models import Client
from tests.wire import VERSION, error_of, request, result_of

pytestmark = pytest.mark.django_db


def assert_error(response, status: int, code: int) -> dict:  # type: ignore[no-untyped-def]
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json"
    error = error_of(response)
    assert error["code"] == code, error
    assert error["message"]
    return error


# --- JSON-RPC framing --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "status", "code"),
    [
        (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list",', 400, -32700),
        (b"\xff\xfe not json", 400, -32700),
        (b'{"jsonrpc": "2.0", "id": NaN, "method": "tools/list"}', 400, -32700),
        (b"  ", 400, -32700),
        (b"[]", 400, -32600),
        (b'[{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}]', 400, -32600),
        (b"42", 400, -32600),
        (b'{"id": 1, "method": "tools/list"}', 400, -32600),
        (b'{"jsonrpc": "1.0", "id": 1, "method": "tools/list"}', 400, -32600),
        (b'{"jsonrpc": "2.0", "id": 1, "method": 7}', 400, -32600),
        (b'{"jsonrpc": "2.0", "id": 1, "method": ""}', 400, -32600),
        (b'{"jsonrpc": "2.0", "id": true, "method": "tools/list"}', 400, -32600),
        (b'{"jsonrpc": "2.0", "id": {"a": 1}, "method": "tools/list"}', 400, -32600),
        (b'{"jsonrpc": "2.0", "id": 1, "result": {}}', 400, -32600),
    ],
)
def test_malformed_messages(mcp, raw: bytes, status: int, code: int) -> None:  # type: ignore[no-untyped-def]
    assert_error(mcp.post(raw=raw, headers={"Mcp-Method": "tools/list"}), status, code)


def test_error_responses_carry_the_request_id(mcp) -> None:  # type: ignore[no-untyped-def]
    response = mcp.post(request("no/such", id="req-7"))
    assert json.loads(response.content)["id"] == "req-7"


def test_a_notification_is_accepted_with_202_and_no_body(mcp) -> None:  # type: ignore[no-untyped-def]
    body = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}}
    response = mcp.post(body)
    assert response.status_code == 202
    assert response.content == b""


# --- the _meta envelope ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"_meta": "x"},
        {"_meta": {"io.modelcontextprotocol/clientCapabilities": {}}},
        {"_meta": {"io.modelcontextprotocol/protocolVersion": VERSION}},
        {
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": VERSION,
                "io.modelcontextprotocol/clientCapabilities": [],
            }
        },
        {
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": VERSION,
                "io.modelcontextprotocol/clientCapabilities": {},
                "io.modelcontextprotocol/logLevel": "loud",
            }
        },
    ],
)
def test_a_missing_or_malformed_envelope_is_invalid_params(mcp, params) -> None:  # type: ignore[no-untyped-def]
    body = {"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": params}
    assert_error(mcp.post(body), 400, -32602)


def test_params_must_be_an_object(mcp) -> None:  # type: ignore[no-untyped-def]
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": [1, 2]}
    assert_error(mcp.post(body), 400, -32602)


def test_client_info_is_optional(mcp) -> None:  # type: ignore[no-untyped-def]
    body = request("server/discover")
    del body["params"]["_meta"]["io.modelcontextprotocol/clientInfo"]
    assert result_of(mcp.post(body))["supportedVersions"] == [VERSION]


def test_an_unsupported_version_lists_the_supported_ones(mcp) -> None:  # type: ignore[no-untyped-def]
    body = request("server/discover")
    body["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = "2099-01-01"
    error = assert_error(
        mcp.post(body, headers={"MCP-Protocol-Version": "2099-01-01"}), 400, -32022
    )
    assert error["data"] == {"supported": [VERSION], "requested": "2099-01-01"}


# --- MCP headers (SEP-2243) --------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        {"MCP-Protocol-Version": None},
        {"MCP-Protocol-Version": "2025-11-25"},
        {"Mcp-Method": None},
        {"Mcp-Method": "tools/call"},
        {"Mcp-Method": "TOOLS/LIST"},
    ],
)
def test_missing_or_mismatched_protocol_headers(mcp, headers) -> None:  # type: ignore[no-untyped-def]
    assert_error(mcp.post(request("tools/list"), headers=headers), 400, -32020)


def test_mcp_name_must_match_the_tool(mcp) -> None:  # type: ignore[no-untyped-def]
    body = request("tools/call", {"name": "greet", "arguments": {"name": "Ada"}})
    assert_error(mcp.post(body, headers={"Mcp-Name": "slow_compute"}), 400, -32020)
    assert_error(mcp.post(body, headers={"Mcp-Name": None}), 400, -32020)


def test_mcp_name_must_match_the_task_id(mcp) -> None:  # type: ignore[no-untyped-def]
    body = request("tasks/get", {"taskId": "abc"}, tasks=True)
    assert_error(mcp.post(body, headers={"Mcp-Name": "other"}), 400, -32020)
    # Missing, it is served from params.taskId (test_routing_headers.py): here, not found.
    assert_error(mcp.post(body, headers={"Mcp-Name": None}), 400, -32602)


def test_header_values_are_trimmed_and_may_be_base64(mcp) -> None:  # type: ignore[no-untyped-def]
    body = request("tools/call", {"name": "greet", "arguments": {"name": "Ada"}})
    assert result_of(mcp.post(body, headers={"Mcp-Name": "  greet\t"}))["content"]
    encoded = "=?base64?" + base64.b64encode(b"greet").decode() + "?="
    assert result_of(mcp.post(body, headers={"Mcp-Name": encoded}))["content"]
    assert_error(mcp.post(body, headers={"Mcp-Name": "=?base64?Z3JlZXQ?="}), 400, -32020)


def test_mirrored_argument_headers_are_checked(mcp) -> None:  # type: ignore[no-untyped-def]
    body = request("tools/call", {"name": "test_routed_by_header", "arguments": {"region": "eu"}})
    assert result_of(mcp.post(body, headers={"Mcp-Param-Region": "eu"}))["content"]
    assert_error(mcp.post(body), 400, -32020)
    assert_error(mcp.post(body, headers={"Mcp-Param-Region": "us"}), 400, -32020)


# --- methods ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "method",
    [
        "no/such",
        "initialize",
        "ping",
        "logging/setLevel",
        "resources/subscribe",
        "resources/unsubscribe",
        "tasks/list",
        "tasks/result",
    ],
)
def test_unknown_and_removed_methods_are_404(mcp, method: str) -> None:  # type: ignore[no-untyped-def]
    assert_error(
        mcp.post(request(method, {"taskId": "x"} if method == "tasks/result" else {})), 404, -32601
    )


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("tools/call", {"name": 7}),
        ("tools/call", {"arguments": {}}),
        ("tools/call", {"name": "greet", "arguments": [1]}),
        ("tools/call", {"name": "greet", "arguments": {"name": "Ada"}, "inputResponses": []}),
        ("tools/call", {"name": "greet", "arguments": {"name": "Ada"}, "inputResponses": {"k": 1}}),
        ("tasks/update", {"taskId": "x", "inputResponses": [1]}),
        ("prompts/get", {"name": "test_simple_prompt", "arguments": {"a": 1}}),
        (
            "completion/complete",
            {"ref": {"type": "ref/other"}, "argument": {"name": "a", "value": ""}},
        ),
    ],
)
def test_params_of_the_wrong_type(mcp, method: str, params: dict) -> None:  # type: ignore[no-untyped-def]
    assert_error(mcp.post(request(method, params, tasks=True)), 400, -32602)


# --- HTTP ---------------------------------------------------------------------------------


@pytest.mark.parametrize("verb", ["get", "delete", "put", "patch"])
def test_other_http_methods_are_405_with_allow_post(client, verb: str) -> None:  # type: ignore[no-untyped-def]
    response = getattr(client, verb)("/mcp")
    assert response.status_code == 405
    assert response["Allow"] == "POST"
    assert error_of(response)["code"] == -32600


@pytest.mark.parametrize("accept", ["text/html", "application/json", "text/event-stream"])
def test_accept_must_allow_json_and_sse(mcp, accept: str) -> None:  # type: ignore[no-untyped-def]
    assert_error(mcp.post(request("tools/list"), headers={"Accept": accept}), 406, -32600)


@pytest.mark.parametrize("accept", [None, "*/*", "application/json;q=1, text/event-stream;q=0.5"])
def test_acceptable_accept_headers(mcp, accept: str | None) -> None:  # type: ignore[no-untyped-def]
    assert result_of(mcp.post(request("tools/list"), headers={"Accept": accept}))["tools"]


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded"])
def test_content_type_must_be_json(mcp, content_type: str) -> None:  # type: ignore[no-untyped-def]
    assert_error(mcp.post(request("tools/list"), content_type=content_type), 415, -32600)


def test_an_oversize_body_is_refused_with_413(mcp, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_MAX_BODY_BYTES = 2048
    body = request("tools/call", {"name": "greet", "arguments": {"name": "x" * 4000}})
    error = assert_error(mcp.post(body), 413, -32600)
    assert "2048" in error["message"]


def test_a_foreign_origin_is_forbidden(mcp, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_ALLOWED_ORIGINS = ["http://127.0.0.1:8000"]
    assert_error(
        mcp.post(request("tools/list"), headers={"Origin": "http://evil.example"}), 403, -32600
    )
    assert result_of(mcp.post(request("tools/list"), headers={"Origin": "http://127.0.0.1:8000"}))


def test_a_foreign_host_is_refused(mcp) -> None:  # type: ignore[no-untyped-def]
    response = mcp.post(request("tools/list"), headers={"Host": "evil.example.com"})
    assert response.status_code == 400


# --- authentication ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "authorization", [None, "Bearer", "Bearer tdk_wrong", "Basic YTpi", "tdk_x"]
)
def test_a_missing_or_bad_token_is_401_with_www_authenticate(mcp, authorization) -> None:  # type: ignore[no-untyped-def]
    response = mcp.post(request("tools/list"), token=None, headers={"Authorization": authorization})
    assert_error(response, 401, -32600)
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_a_revoked_token_is_401(mcp, alice) -> None:  # type: ignore[no-untyped-def]
    tokens.revoke_all(alice)
    assert_error(mcp.post(request("tools/list")), 401, -32600)


def test_anonymous_mode_maps_tokenless_requests_to_one_client(mcp, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_ANONYMOUS_CLIENT = "trial"
    assert result_of(mcp.post(request("tools/list"), token=None))["tools"]
    trial = Client.objects.get(name="trial")
    assert trial.tenant.slug == "trial"
    # A bad token is still refused: anonymous mode only covers requests without one.
    assert_error(mcp.post(request("tools/list"), token="tdk_wrong"), 401, -32600)


# --- the middleware an MCP request goes through ------------------------------------------------


def test_an_mcp_answer_carries_the_api_headers_and_no_page_machinery(mcp) -> None:  # type: ignore[no-untyped-def]
    response = mcp.post(request("tools/list"))

    assert response.status_code == 200
    assert response["Content-Security-Policy"] == "default-src 'none'; frame-ancestors 'none'"
    assert response["X-Frame-Options"] == "DENY"
    assert response["X-Content-Type-Options"] == "nosniff"  # SecurityMiddleware ran
    assert response["X-Request-ID"]  # so did the request context
    assert not response.cookies  # no session, no CSRF cookie
    # Its length is known, so the server sends it whole, not chunked.
    assert response["Content-Length"] == str(len(response.content))


def test_an_mcp_error_carries_them_too(mcp) -> None:  # type: ignore[no-untyped-def]
    response = mcp.post(request("tools/list"), token=None, headers={"Authorization": "Bearer x"})

    assert response.status_code == 401
    assert response["Content-Security-Policy"] == "default-src 'none'; frame-ancestors 'none'"
