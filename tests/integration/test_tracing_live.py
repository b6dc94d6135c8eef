"""One trace across real processes: a client's ``traceparent`` continues through ``tools/call``
in a web process, the leg in a Celery worker's pool process and the leg's effect, and the
worker's JSON log line of the leg carries the trace id.

``tests/tasks_app/test_tracing_conventions.py`` checks the spans' names and attributes in one
process; this checks what that cannot: that the context crosses the broker, that every process
of a stack started with ``OTEL_EXPORTER_OTLP_ENDPOINT`` exports its spans (gunicorn's workers
and Celery's pool processes are forked after the exporter was set up, and export from threads
of their own), and that a pool process's last spans are not lost when its worker stops. The
collector is a small OTLP/HTTP receiver in this test process.

Runs on the database and broker of the run (SQLite + the embedded broker, or PostgreSQL +
Redis or RabbitMQ in CI).
"""

from __future__ import annotations

import gzip
import json
import threading
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from tests.integration.worker_helpers import submit, terminal
from tests.live import LiveStack, live_stack, wait_for
from tests.wire import post, result_of, tools_call, wait_terminal

# broker: CI runs these on RabbitMQ as well as Redis.
pytestmark = [pytest.mark.live, pytest.mark.broker]

TOOL = "send_notice"  # the demo tool whose leg records one effect, named after it
SPANS = (f"tools/call {TOOL}", f"execute_tool {TOOL}", f"effect {TOOL}")
# Celery's instrumentation's spans of the leg's message: sent in the web process, run in the
# worker's pool process. The job's ends a while after the leg's: it goes on to run waiting legs.
MESSAGE_SPANS = ("apply_async/run_task_job", "run/run_task_job")


@dataclass(frozen=True)
class Exported:
    """One span as a process exported it, with the resource of that process."""

    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    resource: dict[str, Any]


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


def _attributes(pairs: list[KeyValue]) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


def environment(collector: Collector, *, delay_ms: int) -> dict[str, str]:
    """A stack's environment that exports every process's spans to COLLECTOR, within DELAY_MS
    of their end, and logs in JSON."""
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": str(delay_ms),
        # The resource names the process that sent a span (process.pid, process.parent_pid).
        "OTEL_EXPERIMENTAL_RESOURCE_DETECTORS": "process",
        "LOG_FORMAT": "json",
        "TASKDESK_LOG_EVERY_TASK": "1",  # the leg's "leg ended" line at INFO
        "TASKDESK_DEMO_NOTICE_SECONDS": "0",
    }


NOTICE = {"to": "ops@example.com", "subject": "traced", "body": "b"}


def ancestors(span: Exported, spans: dict[str, Exported]) -> list[Exported]:
    """SPAN's parent, its parent's, and so on, as far as SPANS (by name) hold them."""
    by_id = {s.span_id: s for s in spans.values()}
    chain: list[Exported] = []
    while (parent := by_id.get(span.parent_span_id)) is not None:
        chain.append(parent)
        span = parent
    return chain


def json_lines(log: str) -> list[dict[str, Any]]:
    """The JSON lines of a log (Celery's few plain notices left out)."""
    return [json.loads(line) for line in log.splitlines() if line.startswith("{")]


class Collector:
    """An OTLP/HTTP receiver (``POST /v1/traces``, protobuf) on a free port of its own, keeping
    every span it is sent."""

    def __init__(self) -> None:
        self.spans: list[Exported] = []
        self._lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path == "/v1/traces":
                    collector._received(ExportTraceServiceRequest.FromString(body))
                    answer = ExportTraceServiceResponse().SerializeToString()
                    self.send_response(200)
                else:
                    answer = b""
                    self.send_response(404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _received(self, request: ExportTraceServiceRequest) -> None:
        spans = [
            Exported(
                name=span.name,
                kind=span.kind,
                trace_id=span.trace_id.hex(),
                span_id=span.span_id.hex(),
                parent_span_id=span.parent_span_id.hex(),
                attributes=_attributes(list(span.attributes)),
                resource=_attributes(list(batch.resource.attributes)),
            )
            for batch in request.resource_spans
            for scoped in batch.scope_spans
            for span in scoped.spans
        ]
        with self._lock:
            self.spans += spans

    def of_trace(self, trace_id: str) -> dict[str, Exported]:
        """The spans of TRACE_ID received so far, by name."""
        with self._lock:
            return {span.name: span for span in self.spans if span.trace_id == trace_id}

    def of_task(self, task_id: str) -> dict[str, Exported]:
        """The spans received so far of the trace of TASK_ID's leg, by name."""
        with self._lock:
            legs = [s for s in self.spans if s.attributes.get("gen_ai.tool.call.id") == task_id]
        return self.of_trace(legs[0].trace_id) if legs else {}

    def __enter__(self) -> Collector:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


def test_a_callers_trace_continues_from_the_web_process_through_the_broker_to_the_worker(  # type: ignore[no-untyped-def]
    transactional_db, alice, alice_token
) -> None:
    trace_id, caller = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    collector = Collector()
    # Each process exports within 0.1 s of a span's end (not the default 5 s).
    with collector, live_stack(env=environment(collector, delay_ms=100), beat=False) as stack:
        arguments = {**NOTICE, "request_key": "trace-1"}
        body, headers = tools_call(TOOL, arguments, key="trace-1", token=alice_token, request_id=7)
        message = json.loads(body)
        message["params"]["_meta"]["traceparent"] = f"00-{trace_id}-{caller}-01"
        response = post(stack.mcp_url, (json.dumps(message).encode(), headers))
        task_id = result_of(response)["taskId"]
        done = wait_terminal(stack.mcp_url, task_id, token=alice_token)
        assert done["status"] == "completed", done
        spans = wait_for(
            "the trace's spans from the web and the worker",
            lambda: found if set(SPANS) <= (found := collector.of_trace(trace_id)).keys() else None,
            30,
            every=0.05,
            explain=lambda: f"received: {sorted(collector.of_trace(trace_id))}",
        )
        # And the spans between the leg and the call, up to the call: the job's ends a while
        # after the leg's (it goes on to run waiting legs).
        call_id = spans[SPANS[0]].span_id

        def chain_to_the_call() -> dict[str, Exported] | None:
            found = collector.of_trace(trace_id)
            chain = ancestors(found[SPANS[1]], found)
            return found if call_id in {span.span_id for span in chain} else None

        spans = wait_for(
            "the chain of spans from the leg up to the call",
            chain_to_the_call,
            30,
            every=0.05,
            explain=lambda: f"received: {sorted(collector.of_trace(trace_id))}",
        )
        worker_log = stack.log("worker")
        web_pid, worker_pid = stack.procs["web"].pid, stack.procs["worker"].pid

    call, leg, effect = (spans[name] for name in SPANS)
    # The server span: the caller's span is its parent, named and attributed as the
    # conventions say.
    assert call.kind == Span.SPAN_KIND_SERVER
    assert call.parent_span_id == caller
    assert call.attributes["mcp.method.name"] == "tools/call"
    assert call.attributes["gen_ai.tool.name"] == TOOL
    assert call.attributes["gen_ai.operation.name"] == "execute_tool"
    assert call.attributes["jsonrpc.request.id"] == "7"
    # A gunicorn worker answered the call; a pool process of the Celery worker ran the leg.
    assert call.resource["process.parent_pid"] == web_pid
    assert leg.resource["process.parent_pid"] == worker_pid
    assert leg.resource["service.instance.id"] != call.resource["service.instance.id"]
    assert leg.attributes["gen_ai.tool.name"] == TOOL
    assert leg.attributes["gen_ai.tool.call.id"] == task_id
    # The effect is the leg's child, in the same process.
    assert effect.parent_span_id == leg.span_id
    assert effect.attributes["taskdesk.effect"] == TOOL
    assert effect.resource["process.pid"] == leg.resource["process.pid"]
    # The leg's chain of parents reaches the call. When a message carried the leg (no worker
    # was standing by for it, or one was handed it and the sweep sent it again), the leg's
    # parent is the job that carried it, whose parent is the span that sent its message, in
    # the web process, below the call.
    chain = ancestors(leg, spans)
    assert call.span_id in {s.span_id for s in chain}, [s.name for s in chain]
    if set(MESSAGE_SPANS) <= spans.keys() and spans[MESSAGE_SPANS[1]].span_id == leg.parent_span_id:
        sent, job = (spans[name] for name in MESSAGE_SPANS)
        assert job.kind == Span.SPAN_KIND_CONSUMER
        assert job.resource["process.pid"] == leg.resource["process.pid"]
        assert (job.parent_span_id, sent.kind) == (sent.span_id, Span.SPAN_KIND_PRODUCER)
        assert sent.resource["process.pid"] == call.resource["process.pid"]

    # The worker's JSON line of the leg carries the trace, and the leg's span.
    (ended,) = [
        line
        for line in json_lines(worker_log)
        if line.get("task_id") == task_id and line["message"].startswith("leg ended")
    ]
    assert ended["trace_id"] == trace_id
    assert ended["span_id"] == leg.span_id


def test_a_stopping_worker_exports_the_spans_it_has_not_sent_yet(transactional_db, alice) -> None:  # type: ignore[no-untyped-def]
    """A pool process ends without the exporter's own flush at exit (``tracing``): the spans
    of its last leg, still waiting for their batch, are sent as the worker stops."""
    with Collector() as collector:
        # No batch is due while the test runs: only the stop can send the leg's spans.
        stack = LiveStack(env=environment(collector, delay_ms=600_000))
        try:
            stack.start_worker(1)
            task = terminal(submit(alice, TOOL, **NOTICE, request_key="trace-2"))
            assert task.status == "completed", task.status_message
            assert not collector.of_task(str(task.pk))
            stack.close()  # a warm shutdown, as a supervisor asks for it
        finally:
            stack.close(graceful=False)
        spans = collector.of_task(str(task.pk))

    assert {f"execute_tool {TOOL}", f"effect {TOOL}"} <= spans.keys(), sorted(spans)
