"""Tracing (the taskdesk[otel] extra): one trace from a tools/call to its first leg, with
OpenTelemetry's in-memory exporter standing in for a collector."""

from __future__ import annotations

import json

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tasks_app import runtime, tracing
from tasks_app.models import Dispatch, Status, Task
from tests.wire import result_of, tools_call


@pytest.fixture
def spans():  # type: ignore[no-untyped-def]
    exporter = InMemorySpanExporter()
    assert tracing.configure(exporter=exporter)
    yield exporter
    tracing.shutdown()


def test_it_is_off_without_an_endpoint(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)

    assert tracing.configure() is False
    assert not tracing.enabled()
    assert tracing.carrier() == {}
    with tracing.span("nothing") as span:
        assert span is None


def test_one_trace_from_the_call_to_its_first_leg(  # type: ignore[no-untyped-def]
    client, alice_token, spans, django_capture_on_commit_callbacks
) -> None:
    body, headers = tools_call(
        "slow_echo", {"text": "hi", "seconds": 0}, key="t-1", token=alice_token
    )
    with django_capture_on_commit_callbacks(execute=True):  # the message is published
        response = client.post("/mcp", data=body, content_type="application/json", headers=headers)
    task_id = result_of(response)["taskId"]
    record = Dispatch.objects.get(task_id=task_id)
    assert record.context["traceparent"].startswith("00-")

    # The leg runs here as a worker would run it, from the record's context.
    assert runtime.run_leg(task_id=task_id, dispatch_id=record.pk) == "completed"
    assert Task.objects.get(pk=task_id).status == Status.COMPLETED

    by_name = {span.name: span for span in spans.get_finished_spans()}
    names = ("tools/call slow_echo", "accept", "dispatch", "publish", "execute_tool slow_echo")
    assert set(by_name) == set(names)
    call, accept, dispatch, publish, leg = (by_name[n] for n in names)
    assert {s.context.trace_id for s in by_name.values()} == {call.context.trace_id}
    assert call.parent is None
    assert accept.parent.span_id == call.context.span_id
    assert dispatch.parent.span_id == accept.context.span_id
    assert publish.parent.span_id == accept.context.span_id  # after commit, still the call's
    assert leg.parent.span_id == dispatch.context.span_id
    assert leg.attributes["taskdesk.task_id"] == task_id
    assert leg.attributes["taskdesk.leg"] == 1
    assert call.attributes["taskdesk.code"] == "ok"


def test_the_message_carries_the_trace_context_too(alice, spans, settings) -> None:  # type: ignore[no-untyped-def]
    from pathlib import Path

    from tasks_app import dispatch

    if not settings.CELERY_BROKER_URL.startswith("filesystem"):
        pytest.skip("reads the message from the embedded broker's folder")
    task = Task.objects.create(client=alice, tool_name="slow_echo", arguments={})
    record = Dispatch.objects.create(task=task, reason="accepted")

    with tracing.span("tools/call"):
        dispatch._send([(record.pk, task.pk)])

    folder = Path(settings.CELERY_BROKER_TRANSPORT_OPTIONS["data_folder_in"])
    messages = [json.loads(path.read_text()) for path in folder.glob("*")]
    (message,) = [m for m in messages if f"'dispatch_id': {record.pk}}}" in m["headers"]["kwargsrepr"]
                  and task.pk in m["headers"]["kwargsrepr"]]  # fmt: skip
    (call,) = spans.get_finished_spans()
    assert message["headers"]["traceparent"].split("-")[1] == format(call.context.trace_id, "032x")
