"""Optional tracing with OpenTelemetry: one trace from a ``tools/call`` to its legs.

Off unless ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set and the ``taskdesk[otel]`` extra is
installed; then every process exports its spans over OTLP/HTTP (the exporter reads the
standard ``OTEL_EXPORTER_OTLP_*`` variables; ``OTEL_SERVICE_NAME`` names the service,
``taskdesk`` by default). The MCP spans follow OpenTelemetry's semantic conventions for MCP
(``docs/gen-ai/mcp.md`` of open-telemetry/semantic-conventions-genai). Spans:

- ``tools/call {tool}`` (another method: its name), kind SERVER, one per ``POST /mcp``
  (``tasks_app.middleware``, ``server``): ``mcp.method.name``, ``gen_ai.tool.name``,
  ``gen_ai.operation.name`` (``execute_tool``), ``jsonrpc.request.id``, ``mcp.session.id``
  and ``mcp.protocol.version`` when sent, ``error.type`` for an error answer. Its parent is
  the context in the message's ``params._meta`` (``traceparent``, ``tracestate``), else the
  HTTP request's (the Django instrumentation's span, or the ``traceparent`` header); with
  both, the HTTP one is a link, as the conventions say;
- ``accept``, the acceptance of the call (``tasks_app.acceptance``), and inside it
  ``dispatch``, the statement that commits the task and its dispatch record;
- ``publish``, sending the record's message after commit (``tasks_app.dispatch``), a child
  of ``accept``;
- ``execute_tool {tool}``, a leg in the worker (``tasks_app.runtime.legs``), a child of
  ``dispatch`` (kind CONSUMER), or of the Celery instrumentation's ``run/run_task_job`` span
  when that one is in the same trace (kind INTERNAL: one consumer span per message);
- ``effect {name}``, each ``ctx.effect`` of a leg (``tasks_app.runtime.effects``).

The trace context (W3C ``traceparent``) is kept in the dispatch record's ``context`` beside
the request id, because a leg may start from the database without its message
(``TASKDESK_WAITING_LEGS_SECONDS``); it also travels in the Celery message's headers. While a
span is current, log records carry ``trace_id`` and ``span_id`` (``logcontext``).

Each process exports its own spans in batches; a Celery pool process sends what it still
holds as it ends (``_flush_at_exit``), as the other processes do at exit.
"""

from __future__ import annotations

import logging
import os
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from django.conf import settings
from django.http import HttpRequest

from tasks_app import logcontext

log = logging.getLogger(__name__)

_tracer: Any = None  # an OpenTelemetry Tracer while tracing is on
_provider: Any = None


def configure(exporter: Any = None, *, instrument: bool | None = None) -> bool:
    """Turn tracing on when OTEL_EXPORTER_OTLP_ENDPOINT is set (or with EXPORTER, a span
    exporter given by a test) and the SDK is installed. Return whether it is on.

    INSTRUMENT (by default: without EXPORTER) also turns on the Django, psycopg and Celery
    instrumentations that are installed."""
    global _tracer, _provider
    if exporter is None and not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return False
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    except ImportError:
        log.warning(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set but the OpenTelemetry SDK is not installed "
            "(pip install 'taskdesk[otel]'): no traces are exported"
        )
        return False
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        processor: Any = BatchSpanProcessor(OTLPSpanExporter())
    else:
        processor = SimpleSpanProcessor(exporter)
    name = os.environ.get("OTEL_SERVICE_NAME") or "taskdesk"
    _provider = TracerProvider(resource=Resource.create({"service.name": name}))
    _provider.add_span_processor(processor)
    _tracer = _provider.get_tracer("taskdesk")
    logcontext.trace_ids = _ids
    if exporter is None if instrument is None else instrument:
        _instrument(_provider)
    from celery.signals import worker_process_shutdown

    worker_process_shutdown.connect(_flush_at_exit, dispatch_uid="taskdesk_tracing_flush")
    return True


def _flush_at_exit(**kwargs: Any) -> None:
    """Export what a Celery pool process has not sent yet, as it ends. The pool process ends
    with ``os._exit``, which skips the provider's own shutdown at exit: without this, the
    spans of its last legs (those of the last ``OTEL_BSP_SCHEDULE_DELAY``, 5 s by default)
    would be lost whenever a worker stops or replaces a pool process. An unreachable
    collector holds the end back by an export's ``OTEL_EXPORTER_OTLP_TIMEOUT``, 30 s at most."""
    if _provider is not None:
        _provider.shutdown()


# The instrumentations of the `otel` extra: (module, class). Django's makes the HTTP server
# span (and reads the traceparent header), psycopg's a span per statement, Celery's a
# PRODUCER span per message sent and a CONSUMER span per job run.
_INSTRUMENTATIONS = (
    ("opentelemetry.instrumentation.django", "DjangoInstrumentor"),
    ("opentelemetry.instrumentation.psycopg", "PsycopgInstrumentor"),
    ("opentelemetry.instrumentation.celery", "CeleryInstrumentor"),
)
_instrumented: list[Any] = []


def _instrument(provider: Any) -> None:
    import importlib

    for module, name in _INSTRUMENTATIONS:
        try:
            instrumentor = getattr(importlib.import_module(module), name)()
        except ImportError:
            continue  # not installed: its spans are simply not made
        if not instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.instrument(tracer_provider=provider)
            _instrumented.append(instrumentor)


def shutdown() -> None:
    """Flush and turn tracing off."""
    global _tracer, _provider
    while _instrumented:
        _instrumented.pop().uninstrument()
    if _provider is not None:
        _provider.shutdown()
    _tracer = _provider = None
    logcontext.trace_ids = None


def enabled() -> bool:
    return _tracer is not None


def _attributes(fields: dict[str, Any]) -> dict[str, Any]:
    return {f"taskdesk.{k}": v for k, v in fields.items() if isinstance(v, str | int | float)}


# What span() and continued() give while tracing is off: one shared context manager, not a
# generator per call (a request opens two, a leg one).
OFF: AbstractContextManager[Any] = nullcontext(None)


def span(name: str, **attributes: Any) -> AbstractContextManager[Any]:
    """A span NAME, child of the current one (None, and no cost, while tracing is off)."""
    if _tracer is None:
        return OFF
    started: AbstractContextManager[Any] = _tracer.start_as_current_span(
        name, attributes=_attributes(attributes)
    )
    return started


def continued(
    carrier: dict[str, Any],
    name: str,
    *,
    conventional: dict[str, Any] | None = None,
    **attributes: Any,
) -> AbstractContextManager[Any]:
    """A span NAME continuing the trace whose context CARRIER holds (``origin``), with the
    CONVENTIONAL attributes as they are named and ATTRIBUTES as ``taskdesk.*``.

    A span already current in that trace (the Celery instrumentation's span of the job that
    carried the record's message) stays its parent, and NAME is then INTERNAL; otherwise
    NAME is the CONSUMER of the record."""
    if _tracer is None:
        return OFF
    from opentelemetry import trace
    from opentelemetry.propagate import extract

    context = extract({k: v for k, v in carrier.items() if isinstance(v, str)})
    remote = trace.get_current_span(context).get_span_context()
    current = trace.get_current_span().get_span_context()
    inside = current.is_valid and current.trace_id == remote.trace_id
    started: AbstractContextManager[Any] = _tracer.start_as_current_span(
        name,
        context=None if inside else context,
        kind=trace.SpanKind.INTERNAL if inside else trace.SpanKind.CONSUMER,
        attributes={**(conventional or {}), **_attributes(attributes)},
        links=[trace.Link(current)] if current.is_valid and not inside else None,
    )
    return started


_PROPAGATED = ("traceparent", "tracestate", "baggage")


def server(request: HttpRequest, known: frozenset[str] | Any) -> AbstractContextManager[Any]:
    """The SERVER span of the MCP message POSTed in REQUEST (``tasks_app.middleware``), named
    and attributed after the MCP conventions; a method not in KNOWN is named ``other``."""
    if _tracer is None:
        return OFF
    from opentelemetry import trace
    from opentelemetry.propagate import extract

    message = _peek(request)
    params = message.get("params")
    params = params if isinstance(params, dict) else {}
    method = message.get("method")
    method = method if isinstance(method, str) else ""
    name = method if method in known else "other"
    attributes: dict[str, Any] = {
        "mcp.method.name": method or "other",
        "network.transport": "tcp",
        "network.protocol.name": "http",
    }
    tool = params.get("name")
    if method == "tools/call" and isinstance(tool, str) and tool:
        name = f"{name} {tool}"
        attributes["gen_ai.tool.name"] = tool
        attributes["gen_ai.operation.name"] = "execute_tool"
    request_id = message.get("id")
    if isinstance(request_id, str | int) and not isinstance(request_id, bool):
        attributes["jsonrpc.request.id"] = str(request_id)
    for attribute, key in (
        ("mcp.session.id", "HTTP_MCP_SESSION_ID"),
        ("mcp.protocol.version", "HTTP_MCP_PROTOCOL_VERSION"),
        ("client.address", "REMOTE_ADDR"),
    ):
        if value := request.META.get(key):
            attributes[attribute] = value
    protocol = request.META.get("SERVER_PROTOCOL", "")
    if protocol.startswith("HTTP/"):
        attributes["network.protocol.version"] = protocol[5:]

    # The HTTP request's context: the Django instrumentation's span, or the header.
    ambient = trace.get_current_span().get_span_context()
    if not ambient.is_valid:
        headers = {k: request.META.get(f"HTTP_{k.upper()}") for k in _PROPAGATED}
        ambient = trace.get_current_span(
            extract({k: v for k, v in headers.items() if isinstance(v, str)})
        ).get_span_context()
    meta = params.get("_meta")
    meta = (
        {k: meta[k] for k in _PROPAGATED if isinstance(meta.get(k), str)}
        if isinstance(meta, dict)
        else {}
    )
    parent = trace.get_current_span(extract(meta)).get_span_context() if meta else None
    if parent is not None and parent.is_valid:
        context, links = extract(meta), [trace.Link(ambient)] if ambient.is_valid else None
    else:
        context, links = trace.set_span_in_context(trace.NonRecordingSpan(ambient)), None
    started: AbstractContextManager[Any] = _tracer.start_as_current_span(
        name, context=context, kind=trace.SpanKind.SERVER, attributes=attributes, links=links
    )
    return started


def _peek(request: HttpRequest) -> dict[str, Any]:
    """The JSON-RPC message of REQUEST as far as the span needs it (empty when it is not one
    the view would read: too long, not JSON). The view parses it again: this costs a second
    parse only while tracing is on."""
    import json

    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return {}
    limit = min(settings.TASKDESK_MAX_BODY_BYTES, settings.DATA_UPLOAD_MAX_MEMORY_SIZE or length)
    if length > limit:
        return {}
    try:
        message = json.loads(request.body)
    except (ValueError, RecursionError):
        return {}
    return message if isinstance(message, dict) else {}


def answered(span: Any, *, code: str, request_id: str) -> None:
    """Record on SPAN (a ``server`` span, or None) how the request was answered: CODE is
    ``ok`` or the JSON-RPC error code."""
    if span is None:
        return
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute("taskdesk.request_id", request_id)
    span.set_attribute("taskdesk.code", code)
    if code != "ok":
        span.set_attribute("error.type", code)
        span.set_attribute("rpc.response.status_code", code)
        span.set_status(Status(StatusCode.ERROR))


def _ids() -> tuple[str, str] | None:
    """The current span's trace and span ids in hex (None outside a span)."""
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return format(context.trace_id, "032x"), format(context.span_id, "016x")


def carrier() -> dict[str, str]:
    """The current trace context as W3C headers (empty while tracing is off)."""
    if _tracer is None:
        return {}
    from opentelemetry.propagate import inject

    headers: dict[str, str] = {}
    inject(headers)
    return headers


def origin() -> dict[str, Any]:
    """What a dispatch record keeps for its leg: the request's log fields
    (``logcontext.origin``) and the trace context."""
    return {**logcontext.origin(), **carrier()}
