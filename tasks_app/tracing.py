"""Optional tracing with OpenTelemetry: one trace from a ``tools/call`` to its legs.

Off unless ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set and the ``taskdesk[otel]`` extra is
installed; then every process exports its spans over OTLP/HTTP (the exporter reads the
standard ``OTEL_EXPORTER_OTLP_*`` variables; ``OTEL_SERVICE_NAME`` names the service,
``taskdesk`` by default). Spans:

- ``tools/call`` (any MCP method: the method's name), one per ``POST /mcp``
  (``tasks_app.middleware``);
- ``accept``, the acceptance of the call (``tasks_app.acceptance``), and inside it
  ``dispatch``, the statement that commits the task and its dispatch record;
- ``publish``, sending the record's message after commit (``tasks_app.dispatch``), a child
  of ``accept``;
- ``leg``, in the worker (``tasks_app.runtime.legs``), a child of ``dispatch``.

The trace context (W3C ``traceparent``) is kept in the dispatch record's ``context`` beside
the request id, because a leg may start from the database without its message
(``TASKDESK_WAITING_LEGS_SECONDS``); it also travels in the Celery message's headers.
"""

from __future__ import annotations

import logging
import os
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from tasks_app import logcontext

log = logging.getLogger(__name__)

_tracer: Any = None  # an OpenTelemetry Tracer while tracing is on
_provider: Any = None


def configure(exporter: Any = None) -> bool:
    """Turn tracing on when OTEL_EXPORTER_OTLP_ENDPOINT is set (or with EXPORTER, a span
    exporter given by a test) and the SDK is installed. Return whether it is on."""
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
    return True


def shutdown() -> None:
    """Flush and turn tracing off."""
    global _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    _tracer = _provider = None


def enabled() -> bool:
    return _tracer is not None


def _attributes(fields: dict[str, Any]) -> dict[str, Any]:
    return {f"taskdesk.{k}": v for k, v in fields.items() if isinstance(v, str | int | float)}


# What span() and continued() give while tracing is off: one shared context manager, not a
# generator per call (a request opens two, a leg one).
_OFF = nullcontext(None)


def span(name: str, **attributes: Any) -> AbstractContextManager[Any]:
    """A span NAME, child of the current one (None, and no cost, while tracing is off)."""
    if _tracer is None:
        return _OFF
    started: AbstractContextManager[Any] = _tracer.start_as_current_span(
        name, attributes=_attributes(attributes)
    )
    return started


def continued(carrier: dict[str, Any], name: str, **attributes: Any) -> AbstractContextManager[Any]:
    """A span NAME continuing the trace whose context CARRIER holds (``origin``)."""
    if _tracer is None:
        return _OFF
    from opentelemetry.propagate import extract

    context = extract({k: v for k, v in carrier.items() if isinstance(v, str)})
    started: AbstractContextManager[Any] = _tracer.start_as_current_span(
        name, context=context, attributes=_attributes(attributes)
    )
    return started


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
