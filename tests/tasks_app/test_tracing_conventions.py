"""Tracing after OpenTelemetry's semantic conventions for MCP (docs/gen-ai/mcp.md of
open-telemetry/semantic-conventions-genai): a caller's ``traceparent``, in the HTTP header or
in ``params._meta``, continues through ``tools/call``, the leg on the worker and its effect,
and the leg's JSON log lines carry the trace id."""

from __future__ import annotations

import json
import logging

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tasks_app import logcontext, runtime, tracing
from tasks_app.models import Dispatch, Status, Task
from tests.wire import result_of, tools_call

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE}-{CALLER}-01"
OTHER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def spans():  # type: ignore[no-untyped-def]
    exporter = InMemorySpanExporter()
    assert tracing.configure(exporter=exporter)
    yield exporter
    tracing.shutdown()


@pytest.fixture
def json_lines():  # type: ignore[no-untyped-def]
    """What the worker's JSON log handler writes, one parsed line per record."""
    lines: list[dict[str, object]] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(json.loads(self.format(record)))

    handler = Collect(level=logging.DEBUG)
    handler.addFilter(logcontext.ContextFilter())
    handler.setFormatter(logcontext.JsonFormatter())
    logger = logging.getLogger("tasks_app")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield lines
    logger.removeHandler(handler)
    logger.setLevel(level)


def _notice(token: str, *, meta: dict[str, str] | None = None) -> tuple[bytes, dict[str, str]]:
    arguments = {"to": "ops@example.com", "subject": "s", "body": "b", "request_key": "n-1"}
    body, headers = tools_call("send_notice", arguments, key="n-1", token=token, request_id=7)
    if meta is not None:
        message = json.loads(body)
        message["params"]["_meta"].update(meta)
        body = json.dumps(message).encode()
    return body, headers


def _call_and_run(client, body, headers, capture):  # type: ignore[no-untyped-def]
    with capture(execute=True):  # the message is published
        response = client.post("/mcp", data=body, content_type="application/json", headers=headers)
    task_id = result_of(response)["taskId"]
    record = Dispatch.objects.get(task_id=task_id)
    # The leg runs here as a worker runs it, from the record's context.
    assert runtime.run_leg(task_id=task_id, dispatch_id=record.pk) == "completed"
    assert Task.objects.get(pk=task_id).status == Status.COMPLETED
    return task_id


@pytest.fixture
def notices(settings):  # type: ignore[no-untyped-def]
    settings.TASKDESK_DEMO_NOTICE_SECONDS = 0


def test_the_callers_traceparent_header_continues_through_the_leg_and_its_effect(  # type: ignore[no-untyped-def]
    client, alice_token, spans, json_lines, notices, django_capture_on_commit_callbacks
) -> None:
    body, headers = _notice(alice_token)
    task_id = _call_and_run(
        client, body, {**headers, "traceparent": TRACEPARENT}, django_capture_on_commit_callbacks
    )

    by_name = {span.name: span for span in spans.get_finished_spans()}
    assert set(by_name) == {
        "tools/call send_notice", "accept", "dispatch", "publish",
        "execute_tool send_notice", "effect send_notice",
    }  # fmt: skip
    assert {format(s.context.trace_id, "032x") for s in by_name.values()} == {TRACE}
    call = by_name["tools/call send_notice"]
    assert call.kind == SpanKind.SERVER
    assert format(call.parent.span_id, "016x") == CALLER
    assert call.parent.is_remote
    assert dict(call.attributes) == {
        "mcp.method.name": "tools/call",
        "gen_ai.tool.name": "send_notice",
        "gen_ai.operation.name": "execute_tool",
        "jsonrpc.request.id": "7",
        "mcp.protocol.version": headers["MCP-Protocol-Version"],
        "network.transport": "tcp",
        "network.protocol.name": "http",
        "network.protocol.version": "1.1",
        "client.address": "127.0.0.1",
        "taskdesk.request_id": call.attributes["taskdesk.request_id"],
        "taskdesk.code": "ok",
    }
    leg, effect = by_name["execute_tool send_notice"], by_name["effect send_notice"]
    assert leg.kind == SpanKind.CONSUMER
    assert leg.parent.span_id == by_name["dispatch"].context.span_id
    assert leg.attributes["gen_ai.operation.name"] == "execute_tool"
    assert leg.attributes["gen_ai.tool.name"] == "send_notice"
    assert leg.attributes["gen_ai.tool.call.id"] == task_id
    assert effect.parent.span_id == leg.context.span_id
    assert effect.attributes["taskdesk.effect"] == "send_notice"

    # The leg's JSON lines carry the trace, and the span current when each was written.
    (ended,) = [line for line in json_lines if str(line["message"]).startswith("leg ended")]
    assert ended["trace_id"] == TRACE
    assert ended["span_id"] == format(leg.context.span_id, "016x")
    assert ended["task_id"] == task_id


def test_a_traceparent_in_params_meta_is_the_parent_and_the_header_a_link(  # type: ignore[no-untyped-def]
    client, alice_token, spans, notices, django_capture_on_commit_callbacks
) -> None:
    body, headers = _notice(alice_token, meta={"traceparent": TRACEPARENT, "tracestate": "ro=1"})
    _call_and_run(
        client, body, {**headers, "traceparent": OTHER}, django_capture_on_commit_callbacks
    )

    by_name = {span.name: span for span in spans.get_finished_spans()}
    assert {format(s.context.trace_id, "032x") for s in by_name.values()} == {TRACE}
    call = by_name["tools/call send_notice"]
    assert format(call.parent.span_id, "016x") == CALLER
    assert call.parent.trace_state.get("ro") == "1"
    (link,) = call.links
    assert format(link.context.trace_id, "032x") == OTHER.split("-")[1]


def test_an_error_answer_has_its_error_type(client, alice_token, spans) -> None:  # type: ignore[no-untyped-def]
    body, headers = tools_call("no_such_tool", {}, key="e-1", token=alice_token)
    client.post("/mcp", data=body, content_type="application/json", headers=headers)

    (call,) = spans.get_finished_spans()
    assert call.name == "tools/call no_such_tool"
    assert call.attributes["error.type"] == call.attributes["rpc.response.status_code"]
    assert call.attributes["error.type"].startswith("-326")
    assert not call.status.is_ok


def test_log_lines_carry_no_trace_fields_while_tracing_is_off(json_lines) -> None:  # type: ignore[no-untyped-def]
    assert not tracing.enabled()
    logging.getLogger("tasks_app.x").info("plain")
    (line,) = json_lines
    assert "trace_id" not in line and "span_id" not in line


def test_the_extras_instrumentations_are_turned_on_with_tracing_and_off_after(settings) -> None:  # type: ignore[no-untyped-def]
    assert tracing.configure(exporter=InMemorySpanExporter(), instrument=True)
    try:
        from opentelemetry.instrumentation.celery import CeleryInstrumentor
        from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

        assert CeleryInstrumentor().is_instrumented_by_opentelemetry
        assert PsycopgInstrumentor().is_instrumented_by_opentelemetry
        assert any("opentelemetry" in m for m in settings.MIDDLEWARE)  # Django's
    finally:
        tracing.shutdown()
    assert not CeleryInstrumentor().is_instrumented_by_opentelemetry
    assert not any("opentelemetry" in m for m in settings.MIDDLEWARE)
