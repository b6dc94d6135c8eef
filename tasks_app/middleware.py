"""Every request gets a request id; every ``POST /mcp`` is counted, timed and logged (at
INFO for calls that change something and for errors, at DEBUG for successful reads).

The id is the caller's ``X-Request-ID`` when it sends a usable one (up to 128 visible ASCII
characters), a new one otherwise; it goes back in the response's ``X-Request-ID`` header and
onto every log line of the request (``tasks_app.logcontext``), and the dispatch record of a
task the request creates keeps it for the task's first leg.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import secrets
import time
from collections.abc import Callable
from contextlib import nullcontext

from django.conf import settings
from django.http import HttpRequest, HttpResponseBase

from tasks_app import logcontext, metrics, tracing
from tasks_app.mcp import views as mcp_views
from tasks_app.mcp.headers import sent
from tasks_app.mcp.methods import methods

log = logging.getLogger("tasks_app.mcp")

HEADER = "X-Request-ID"
_USABLE = re.compile(r"[!-~]{1,128}")
# The methods whose successful calls are logged at INFO.
LOGGED_METHODS = frozenset({"tasks/cancel", "tasks/update", "initialize"})


def request_id_for(request: HttpRequest) -> str:
    given = sent(request, HEADER) or ""
    return given if _USABLE.fullmatch(given) else new_request_id()


# A new request id is this process's random prefix and a count: 32 hex digits, as a UUID's,
# unique across processes and hosts, without asking the kernel for 16 random bytes (and
# building a UUID) on every request. A forked child draws a prefix of its own.
_prefix = ""
_count = itertools.count()


def _new_prefix() -> None:
    global _prefix, _count
    _prefix, _count = secrets.token_hex(8), itertools.count()


_new_prefix()
os.register_at_fork(after_in_child=_new_prefix)


def new_request_id() -> str:
    return f"{_prefix}{next(_count):016x}"


class ProbeMiddleware:
    """``GET /livez``, ``/readyz`` and ``/metrics`` are answered here, before the host check
    and the HTTPS redirect: a Kubernetes probe or a Prometheus scrape comes over plain HTTP on
    the pod network, addressed by the pod's IP, with any Host. What they answer does not
    depend on the host (``/metrics`` keeps its own token or loopback rule, ``/readyz`` its
    status alone for an anonymous caller), and no session, cookie or CSRF token is read."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        from tasks_app import views

        self.get_response = get_response
        self.probes: dict[str, Callable[[HttpRequest], HttpResponseBase]] = {
            "/livez": views.livez,
            "/readyz": views.readyz,
            "/metrics": views.metrics_view,
        }

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        probe = self.probes.get(request.path_info)
        if probe is not None and request.method == "GET":
            response = probe(request)
            response["X-Content-Type-Options"] = "nosniff"
            return response
        return self.get_response(request)


class RequestContextMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        request_id = request_id_for(request)
        started = time.monotonic()
        mcp = request.path == mcp_views.PATH and request.method == "POST"
        with (
            logcontext.bound(request_id=request_id) as context,
            tracing.server(request, methods) if mcp else nullcontext() as span,
        ):
            response = self.get_response(request)
            if mcp:
                code = self._observe(context, response, time.monotonic() - started)
                tracing.answered(span, code=code, request_id=request_id)
        response[HEADER] = request_id
        return response

    def _observe(
        self, context: dict[str, object], response: HttpResponseBase, seconds: float
    ) -> str:
        """Count, time and log the request; return its code label."""
        # The view puts the JSON-RPC method in the context, and an error answer its code.
        # A method the server does not have is counted as "other": the label's values stay
        # a short, fixed list whatever clients send.
        sent = context.get("method")
        method = sent if isinstance(sent, str) and sent in methods else "other"
        code = str(context.get("code") or "ok")
        metrics.mcp_request(method=method, code=code, seconds=seconds)
        # Every error, and the calls a person makes (initialize, tasks/cancel, tasks/update),
        # at INFO; successful reads (tasks/get polls, listings, ping) at DEBUG, so polling
        # clients do not flood the log; a successful tools/call at INFO only with
        # TASKDESK_LOG_EVERY_TASK (one line per task costs more than the rest of the log).
        if (
            code != "ok"
            or method in LOGGED_METHODS
            or (method == "tools/call" and settings.TASKDESK_LOG_EVERY_TASK)
        ):
            level = logging.INFO
        else:
            level = logging.DEBUG
        log.log(
            level,
            "mcp %s %s http=%s ms=%.0f",
            sent if isinstance(sent, str) else "-",
            code,
            response.status_code,
            seconds * 1000,
        )
        return code


class McpRouteMiddleware:
    """``/mcp`` goes straight to the MCP view, past the middleware of the pages.

    Placed after the request context and ``SecurityMiddleware``, so every MCP answer still
    gets its request id, metrics, log line and the security headers, and the Host header is
    checked here as ``CommonMiddleware`` checks it for the pages, and a JSON answer gets its
    ``Content-Length`` as ``CommonMiddleware`` gives the pages theirs. What follows in
    ``MIDDLEWARE`` serves the operator console: static files, sessions, CSRF, logins, flash
    messages, htmx, lockouts and the pages' content security policy; none of it applies to a
    bearer-token JSON endpoint, and running it cost every MCP request a fifth of its CPU. An
    MCP answer instead carries the fixed policy an API needs (nothing may load from it, and
    nothing may frame it).
    """

    POLICY = "default-src 'none'; frame-ancestors 'none'"

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        from tasks_app.mcp.views import McpView

        self.get_response = get_response
        self.view = McpView.as_view()

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        if request.path_info != mcp_views.PATH:
            return self.get_response(request)
        # Django checks the Host header against ALLOWED_HOSTS when something asks for it
        # (CommonMiddleware, for the pages): DNS rebinding must not reach a local server.
        request.get_host()
        response = self.view(request)
        # As CommonMiddleware does for the pages: with its length known, a JSON answer goes
        # out as headers and body, not chunked (headers, a chunk and the end chunk: one more
        # write for the server, and one more segment for the client to read, on every call).
        if not response.streaming and not response.has_header("Content-Length"):
            response["Content-Length"] = str(len(response.content))
        response.setdefault("Content-Security-Policy", self.POLICY)
        response.setdefault("X-Frame-Options", "DENY")
        return response
