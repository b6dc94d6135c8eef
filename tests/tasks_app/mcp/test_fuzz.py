"""Fuzzing the /mcp envelope and headers with hypothesis: whatever arrives, the answer is a
clear JSON-RPC error or a result, never a 5xx other than 503, and never -32603 (which is kept
for bugs). The examples are bounded (``max_examples``) so the run takes seconds in CI.

Messages are built near the real shape (known methods, a ``_meta`` envelope, params of the
right kind) and then bent: missing or wrong-typed fields, odd ids, strings with any code
point (lone surrogates, NUL, and the like, sent as JSON escapes), headers that disagree with
the body, and raw bodies that are barely JSON.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from tests.wire import KEY_META, TASKS, VERSION

pytestmark = pytest.mark.django_db

# More for a longer hunt: TASKDESK_FUZZ_EXAMPLES=5000 pytest tests/tasks_app/mcp/test_fuzz.py
EXAMPLES = int(os.environ.get("TASKDESK_FUZZ_EXAMPLES") or 120)
METHODS = [
    "server/discover",
    "tools/list",
    "tools/call",
    "prompts/list",
    "prompts/get",
    "resources/list",
    "resources/read",
    "resources/templates/list",
    "completion/complete",
    "tasks/get",
    "tasks/update",
    "tasks/cancel",
    "initialize",
    "notifications/cancelled",
]
TOOLS = ["slow_echo", "confirm_action", "export_report", "send_notice", "greet", "no_such"]

# Mostly ordinary text (NUL and other controls included); now and then any code point, lone
# surrogates included (json.dumps sends what is not ASCII as escapes).
any_text = (
    st.text(max_size=12)
    | st.text(st.characters(exclude_categories=()), max_size=12)
    | st.sampled_from(["\x00", "a\ud800", "\udfff", "\ufeff", "\u2028"])
)
# What an HTTP header can carry: printable latin-1.
header_text = st.text(
    st.characters(min_codepoint=32, max_codepoint=255, exclude_characters="\x7f"), max_size=20
)
scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | any_text
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(any_text, inner, max_size=3),
    max_leaves=8,
)


def sometimes(value: Any) -> st.SearchStrategy[Any]:
    """VALUE nine times in ten, otherwise anything."""
    return st.integers(0, 9).flatmap(lambda n: json_values if n == 0 else st.just(value))


@st.composite
def envelopes(draw: st.DrawFn) -> Any:
    caps: dict[str, Any] = {}
    if draw(st.booleans()):
        caps["extensions"] = draw(sometimes({TASKS: {}}))
    if draw(st.booleans()):
        caps["elicitation"] = draw(sometimes({"form": {}}))
    meta: dict[str, Any] = {
        "io.modelcontextprotocol/protocolVersion": draw(sometimes(VERSION)),
        "io.modelcontextprotocol/clientCapabilities": draw(sometimes(caps)),
    }
    if draw(st.booleans()):
        meta["io.modelcontextprotocol/clientInfo"] = draw(
            sometimes({"name": "fuzz", "version": "1"})
        )
    if draw(st.booleans()):
        meta[KEY_META] = draw(sometimes(draw(st.text(max_size=12))))
    if draw(st.booleans()):
        meta["progressToken"] = draw(sometimes(draw(st.integers() | st.text(max_size=8))))
    if draw(st.booleans()):
        meta["io.modelcontextprotocol/logLevel"] = draw(sometimes("debug"))
    return draw(sometimes(meta))


@st.composite
def params_for(draw: st.DrawFn, method: str) -> Any:
    params: dict[str, Any] = {"_meta": draw(envelopes())}
    if method == "tools/call":
        params["name"] = draw(sometimes(draw(st.sampled_from(TOOLS))))
        arguments = draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "text": any_text,
                    # Short: a synchronous call really runs here.
                    "seconds": st.floats(0, 0.05) | scalars,
                    "name": any_text,
                    "action": any_text,
                    "quarter": any_text,
                },
            )
        )
        params["arguments"] = draw(sometimes(arguments))
    elif method in ("prompts/get",):
        params["name"] = draw(any_text)
        params["arguments"] = draw(sometimes({"x": "y"}))
    elif method == "resources/read":
        params["uri"] = draw(sometimes("demo://nothing"))
    elif method.startswith("tasks/"):
        params["taskId"] = draw(sometimes(draw(st.text(max_size=40))))
        if method == "tasks/update":
            params["inputResponses"] = draw(sometimes({"confirm": {"action": "accept"}}))
    elif method == "completion/complete":
        params["ref"] = draw(json_values)
        params["argument"] = draw(json_values)
    if draw(st.integers(0, 9)) == 0:
        params["cursor"] = draw(json_values)
    return draw(sometimes(params))


@st.composite
def messages(draw: st.DrawFn) -> tuple[bytes, dict[str, str]]:
    method = draw(sometimes(draw(st.sampled_from(METHODS))))
    message: dict[str, Any] = {"jsonrpc": draw(sometimes("2.0")), "method": method}
    if draw(st.integers(0, 9)):
        message["id"] = draw(sometimes(draw(st.integers() | st.text(max_size=8))))
    if draw(st.integers(0, 9)):
        message["params"] = draw(params_for(method if isinstance(method, str) else ""))
    if draw(st.integers(0, 9)) == 0:
        message[draw(st.sampled_from(["result", "error", "x"]))] = draw(json_values)
    body = json.dumps(message).encode()
    if draw(st.integers(0, 9)) == 0:  # a raw mutation of the text
        at = draw(st.integers(0, len(body)))
        body = body[:at] + draw(st.binary(max_size=4)) + body[at:]

    name = None
    params = message.get("params")
    if isinstance(params, dict):
        name = params.get("name", params.get("taskId", params.get("uri")))
    headers = {
        "Accept": draw(sometimes("application/json, text/event-stream")),
        "MCP-Protocol-Version": draw(sometimes(VERSION)),
        "Mcp-Method": draw(sometimes(method)),
        "Mcp-Name": draw(sometimes(name)),
        "Idempotency-Key": draw(st.none() | st.none() | header_text),
        "Mcp-Param-Text": draw(st.none() | st.none() | header_text),
    }
    sent = {k: v for k, v in headers.items() if isinstance(v, str)}
    return body, {k: v for k, v in sent.items() if all(32 <= ord(c) <= 255 for c in v)}


@hypothesis_settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sent=messages())
def test_no_input_gets_a_5xx_or_an_internal_error(mcp, settings, sent) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_SYNC_MAX_SECONDS = 1.0
    body, headers = sent

    response = mcp.post(raw=body, headers=headers)

    assert response.status_code < 500 or response.status_code == 503, response.content
    if response.status_code == 202:
        assert response.content == b""
        return
    if response["Content-Type"].startswith("text/event-stream"):
        raw = b"".join(response.streaming_content).decode()
        answers = [json.loads(line[5:]) for line in raw.splitlines() if line.startswith("data:")]
        answer = answers[-1]
    else:
        answer = json.loads(response.content)
    assert answer["jsonrpc"] == "2.0"
    event(f"{response.status_code} {answer.get('error', {}).get('code', 'ok')}")
    if "error" in answer:
        assert answer["error"]["code"] != -32603, answer
        assert response.status_code != 200 or answer["error"]["code"] not in (-32700, -32600)
    else:
        assert response.status_code == 200 and "result" in answer, answer
