"""The 2026-07-28 era: stateless Streamable HTTP with the per-request ``_meta`` envelope.

Checks run in a fixed order, so each bad request gets the most specific error: the JSON-RPC
shape (-32600), the envelope (-32602), the MCP headers against the body (-32020, SEP-2243),
the protocol version (-32022), the method (-32601, HTTP 404: removed methods such as
``initialize``, ``ping``, ``tasks/list`` and ``tasks/result`` are simply absent), the
``Mcp-Name`` header of name-bearing methods (-32020), then the method's params (-32602).

``Mcp-Name`` must be present on ``tools/call``, ``prompts/get`` and ``resources/read`` (the
core's required headers). On ``tasks/get``, ``tasks/update`` and ``tasks/cancel`` it is the
tasks extension's routing header: one that disagrees with ``params.taskId`` is -32020, a
missing one is served from the body (clients such as fastmcp-tasks 4.1.4 leave it out) and
counted in ``taskdesk_mcp_routing_header_missing_total``, unless
``TASKDESK_STRICT_ROUTING_HEADERS`` refuses it too. ``MCP-Protocol-Version`` and
``Mcp-Method`` are required on every request, as the core says.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpResponse, HttpResponseBase
from rest_framework.request import Request
from rest_framework.views import APIView

from tasks_app import metrics
from tasks_app.mcp import (
    envelope,
    eras,
    handlers,  # noqa: F401 (registers the methods)
    limits,
    listen,  # noqa: F401 (registers subscriptions/listen)
    streaming,
)
from tasks_app.mcp.errors import (
    HeaderMismatch,
    InvalidParams,
    InvalidRequest,
    MethodNotFound,
    UnsupportedVersion,
)
from tasks_app.mcp.headers import header
from tasks_app.mcp.methods import methods
from tasks_app.mcp.registry import Call, Method
from tasks_app.mcp.streaming import Streamed
from tasks_app.models import Client, Era

VERSION = Era.MODERN.value


def _check_name(request: Request, spec: Method, value: str) -> None:
    """Raise HeaderMismatch unless the ``Mcp-Name`` header equals VALUE, the body's
    ``params[spec.name_param]``. A missing header is accepted where the method does not
    require it (tasks/*: the body's taskId is what is served) unless
    ``TASKDESK_STRICT_ROUTING_HEADERS``, and counted; one that disagrees never is (SEP-2663:
    a server that sees both must reject a mismatch)."""
    sent_name = header(request, "Mcp-Name")
    if sent_name is None:
        if not spec.name_required and not settings.TASKDESK_STRICT_ROUTING_HEADERS:
            metrics.mcp_routing_header_missing(method=spec.name)
            return
        raise HeaderMismatch(
            f"The Mcp-Name header is missing: it must be present and equal params.{spec.name_param}"
        )
    if sent_name != value:
        raise HeaderMismatch(f"The Mcp-Name header must equal params.{spec.name_param}")


class ModernEra(eras.ProtocolEra):
    versions = (VERSION,)

    def claims(self, request: Request, message: dict[str, Any]) -> bool:
        return True

    def handle(
        self, request: Request, view: APIView, message: dict[str, Any], client: Client
    ) -> HttpResponseBase:
        request_id: str | int | None = None
        try:
            if "method" not in message:
                raise InvalidRequest(
                    "Only requests and notifications are accepted: this wire has no "
                    "server-to-client requests to respond to"
                )
            method = message["method"]
            if not isinstance(method, str) or not method:
                raise InvalidRequest("method must be a non-empty string")
            if "id" not in message:
                return HttpResponse(status=202)  # a notification: nothing to answer
            request_id = eras.request_id(message)
            return self._answer(request, view, message, method, request_id, client)
        except Exception as exc:
            # With the request's id: an outage (503) or a bug (-32603, logged with a reference).
            return streaming.error_response(request_id, limits.error_for(exc))

    def _answer(
        self,
        request: Request,
        view: APIView,
        message: dict[str, Any],
        method: str,
        request_id: str | int,
        client: Client,
    ) -> HttpResponseBase:
        params = message.get("params")
        if params is not None and not isinstance(params, dict):
            raise InvalidParams("params must be an object")
        meta = envelope.parse(params)
        assert params is not None  # envelope.parse refuses missing params
        version_header = header(request, "MCP-Protocol-Version")
        if version_header != meta.protocol_version:
            raise HeaderMismatch(
                "The MCP-Protocol-Version header must be present and equal the body's "
                f"_meta['{envelope.PROTOCOL_VERSION}']"
            )
        if header(request, "Mcp-Method") != method:
            raise HeaderMismatch(
                "The Mcp-Method header must be present and equal the body's method"
            )
        if meta.protocol_version not in self.versions:
            # The versions this wire serves: a handshake version is reached with initialize,
            # not with the envelope, so it is not listed here.
            raise UnsupportedVersion(requested=meta.protocol_version, supported=list(self.versions))
        spec = methods.get(method)
        if spec is None:
            raise MethodNotFound(f"Method not found: {method}")
        if spec.name_param is not None:
            value = params.get(spec.name_param)
            if isinstance(value, str):
                _check_name(request, spec, value)
        call = Call(
            id=request_id,
            method=method,
            params=params,
            envelope=meta,
            client=client,
            request=request,
            view=view,
            data=spec.validate(params),
        )
        result = spec.handler(call)
        if isinstance(result, HttpResponseBase):
            return result  # an answer of its own (the subscriptions/listen stream)
        if isinstance(result, Streamed):
            return streaming.respond(request_id, result)
        return streaming.json_response(streaming.success(request_id, result))


eras.register(ModernEra(), default=True)
