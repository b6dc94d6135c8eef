"""``/mcp``: the transport every protocol era shares.

The view checks what does not depend on the protocol era (HTTP method, Origin, bearer token,
media types, body size, JSON syntax) and hands the parsed message to its era
(``tasks_app.mcp.eras``). ``GET`` and ``DELETE`` go to the era that serves them (the
2025-11-25 sessions); without one they are 405. Errors are JSON-RPC error objects with the
HTTP status the 2026-07-28 Streamable HTTP transport gives them.

A body that is not a JSON-RPC message gets 400 whatever is wrong with it: not UTF-8, not JSON,
nested deeper than ``TASKDESK_MAX_JSON_DEPTH``, or holding a lone surrogate (``"\\ud800"``:
valid JSON syntax, but no Unicode text, so it could neither be stored nor echoed back). A
database, broker or cache outage is 503 with ``Retry-After`` (``limits.outage``); anything
else unexpected is -32603 with a reference that the log line carries too, never its text.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any, cast

from django.conf import settings
from django.http import HttpResponseBase
from rest_framework import exceptions
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.views import APIView

# modern and handshake register their eras (handshake last: it is asked first).
from tasks_app import logcontext
from tasks_app.mcp import eras, handshake, limits, modern, scopes, streaming  # noqa: F401
from tasks_app.mcp.auth import BearerTokenAuthentication, HasClient, InvalidToken
from tasks_app.mcp.errors import (
    ForbiddenOrigin,
    InsufficientScope,
    InvalidParams,
    InvalidRequest,
    McpError,
    MethodNotAllowed,
    NotAcceptable,
    ParseError,
    PayloadTooLarge,
    Unauthorized,
    UnsupportedMediaType,
)
from tasks_app.mcp.headers import sent
from tasks_app.models import Client
from tasks_app.oauth import resource
from tasks_app.oauth.access import CALL, Access

# The endpoint's one address: config/urls.py routes it, the middleware counts and logs it, and
# it is the path of the protected resource that access tokens name (tasks_app.oauth.resource).
PATH = resource.MCP_PATH

log = logging.getLogger("tasks_app.mcp")

_JSON_TYPES = {"application/json", "application/*", "*/*"}
_SSE_TYPES = {"text/event-stream", "text/*", "*/*"}


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _not_unicode(value: str) -> bool:
    if value.isascii():
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


# The only ways a strictly decoded, strictly parsed JSON text gets U+0000 or a lone surrogate
# into a string: the escapes \u0000 and \uD800-\uDFFF. (A match may be a false alarm, such
# as an escaped backslash followed by "u0000"; then the full walk decides.)
_SUSPECT_ESCAPE = re.compile(r"\\u(?:0000|[dD][89a-fA-F])")


def _too_deep(message: Any, max_depth: int) -> McpError | None:
    """The depth check alone: containers only, a level at a time (the scalars, most of a body
    of many small objects, are never visited one by one)."""
    level = [message]
    for _ in range(max_depth):
        inner: list[Any] = []
        for value in level:
            items = value.values() if type(value) is dict else value
            inner.extend(item for item in items if type(item) is dict or type(item) is list)
        if not inner:
            return None
        level = inner
    return InvalidRequest(
        f"The message nests deeper than {max_depth} levels (TASKDESK_MAX_JSON_DEPTH)",
        data={"maxDepth": max_depth},
    )


def shape_problem(message: Any, max_depth: int, text: str | None = None) -> McpError | None:
    """Why MESSAGE (parsed JSON) cannot be taken as it is, or None. Walks the value without
    recursion, so any depth is safe to check. Given the TEXT it was parsed from, strings are
    looked at only when the text holds an escape that could make a bad one, so a body without
    escapes is never walked string by string.

    U+0000 is refused too: it is valid JSON, but PostgreSQL can store it neither in text nor
    in jsonb, so a task or an answer holding it could not be kept (on SQLite alike, so that
    both behave the same).
    """
    if text is not None and not _SUSPECT_ESCAPE.search(text):
        return _too_deep(message, max_depth) if type(message) in (dict, list) else None
    stack: list[tuple[Any, int, bool]] = [(message, 1, False)]
    while stack:
        value, depth, in_params = stack.pop()
        if isinstance(value, str):
            if _not_unicode(value):
                return ParseError(
                    "Parse error: the body holds a lone surrogate (such as \\ud800), "
                    "which is not Unicode text"
                )
            if "\x00" in value:
                where = "params" if in_params else "the message"
                error = InvalidParams if in_params else InvalidRequest
                return error(f"A string in {where} holds U+0000 (NUL), which cannot be stored")
        elif isinstance(value, dict | list):
            if depth > max_depth:
                return InvalidRequest(
                    f"The message nests deeper than {max_depth} levels (TASKDESK_MAX_JSON_DEPTH)",
                    data={"maxDepth": max_depth},
                )
            if isinstance(value, dict):
                for key, item in value.items():
                    inside = in_params or (depth == 1 and key == "params")
                    stack.append((key, depth, inside))
                    stack.append((item, depth + 1, inside))
            else:
                stack.extend((item, depth + 1, in_params) for item in value)
    return None


def _media_types(value: str) -> set[str]:
    return {part.split(";", 1)[0].strip().lower() for part in value.split(",")}


class McpView(APIView):
    authentication_classes = [BearerTokenAuthentication]
    permission_classes = [HasClient]
    throttle_classes: list[Any] = []  # tasks/get applies PollThrottle itself
    parser_classes: list[Any] = []  # the body is read and parsed here, with its own limits
    renderer_classes = [JSONRenderer]

    @property
    def default_response_headers(self) -> dict[str, str]:
        return {}

    def perform_content_negotiation(
        self, request: Request, force: bool = False
    ) -> tuple[BaseRenderer, str]:
        # Accept is checked against the MCP transport's rule in post(), not DRF's renderers.
        return JSONRenderer(), "application/json"

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        if request.method != "POST" and (
            request.method not in ("GET", "DELETE") or eras.for_other_method(request) is None
        ):
            raise MethodNotAllowed()
        origin = sent(request, "Origin")
        # Browsers send Origin; a page from a foreign origin must not reach a local server
        # (DNS rebinding). Clients that are not browsers send none.
        if origin is not None and origin.rstrip("/").lower() not in _allowed_origins():
            raise ForbiddenOrigin(f"Origin {origin} is not allowed")
        super().initial(request, *args, **kwargs)

    def post(self, request: Request) -> HttpResponseBase:
        message = self._message(request)
        client = cast(Client, request.user)  # HasClient lets only a client through
        logcontext.update(method=message.get("method"), client=client.name)
        # Checked here, for both eras alike, before an era reads anything.
        scope = scopes.needed(message)
        if scope not in cast(Access, request.auth).scopes:
            method, request_id = message.get("method"), message.get("id")
            refusal = InsufficientScope(
                scope=scope, method=method if isinstance(method, str) else "this response"
            )
            return streaming.error_response(
                request_id if isinstance(request_id, str | int) else None, refusal
            )
        era = eras.select(request, message)
        return era.handle(request, self, message, client)

    def get(self, request: Request) -> HttpResponseBase:
        return self._other(request)

    def delete(self, request: Request) -> HttpResponseBase:
        return self._other(request)

    def _other(self, request: Request) -> HttpResponseBase:
        if CALL not in cast(Access, request.auth).scopes:
            refusal = InsufficientScope(scope=CALL, method=f"{request.method} {PATH}")
            return streaming.error_response(None, refusal)
        era = eras.for_other_method(request)
        assert era is not None  # initial() answered 405 otherwise
        return era.other_method(request, self, cast(Client, request.user))

    def _message(self, request: Request) -> dict[str, Any]:
        content_type = sent(request, "Content-Type") or ""
        if content_type.split(";", 1)[0].strip().lower() != "application/json":
            raise UnsupportedMediaType()
        accept = sent(request, "Accept")
        if accept is not None:
            types = _media_types(accept)
            if not (types & _JSON_TYPES and types & _SSE_TYPES):
                raise NotAcceptable()
        limit = settings.TASKDESK_MAX_BODY_BYTES
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            raise InvalidRequest("Content-Length is not a number") from None
        if length > limit:
            raise PayloadTooLarge(
                f"The request body is {length} bytes; the limit is {limit} bytes "
                "(TASKDESK_MAX_BODY_BYTES)",
                data={"limit": limit},
            )
        max_depth = settings.TASKDESK_MAX_JSON_DEPTH
        try:
            # JSON on the wire is UTF-8 (RFC 8259 section 8.1); strict decoding also refuses
            # encoded surrogates, which json.loads(bytes) would let through.
            text = request.body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ParseError(f"Parse error: the body is not UTF-8 ({exc.reason})") from None
        try:
            message = json.loads(text, parse_constant=_reject_constant)
        except RecursionError:
            raise InvalidRequest(
                f"The message nests deeper than {max_depth} levels (TASKDESK_MAX_JSON_DEPTH)",
                data={"maxDepth": max_depth},
            ) from None
        except ValueError as exc:
            raise ParseError(f"Parse error: {exc}") from None
        problem = shape_problem(message, max_depth, text)
        if problem is not None:
            raise problem
        if isinstance(message, list):
            raise InvalidRequest("Batches are not supported: send one JSON-RPC message per POST")
        if not isinstance(message, dict):
            raise InvalidRequest("The body must be one JSON-RPC message (a JSON object)")
        if message.get("jsonrpc") != "2.0":
            raise InvalidRequest('jsonrpc must be "2.0"')
        return message

    # DRF's dispatch takes any HttpResponseBase from here; its stubs ask for a Response.
    def handle_exception(self, exc: Exception) -> HttpResponseBase:  # type: ignore[override]
        if isinstance(exc, McpError):
            return streaming.error_response(None, exc)
        if isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
            message = None if isinstance(exc, exceptions.NotAuthenticated) else str(exc.detail)
            unauthorized = Unauthorized(message, invalid_token=isinstance(exc, InvalidToken))
            return streaming.error_response(None, unauthorized)
        if isinstance(exc, exceptions.APIException):
            error = InvalidRequest(str(exc.detail))
            error.http_status = exc.status_code
            return streaming.error_response(None, error)
        return streaming.error_response(None, limits.error_for(exc))


_origins: dict[tuple[str, ...], frozenset[str]] = {}


def _allowed_origins() -> frozenset[str]:
    configured = tuple(settings.TASKDESK_ALLOWED_ORIGINS)
    allowed = _origins.get(configured)
    if allowed is None:
        allowed = _origins[configured] = frozenset(o.rstrip("/").lower() for o in configured)
    return allowed
