"""JSON-RPC errors of the MCP endpoint, one class per kind, each with its HTTP status.

A handler raises one of these; the transport turns it into a JSON-RPC error response with
the request's id. The HTTP statuses follow the 2026-07-28 Streamable HTTP transport: an
unknown method is 404, the envelope, header, capability and version errors are 400, and an
internal error stays 200 (the JSON-RPC body carries the failure). A refusal to do the work
now (busy, over a quota, an outage: ``RetryLater``, built in ``tasks_app.mcp.limits``) is
-32000 with HTTP 429 or 503 and ``Retry-After``.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from tasks_app.models import TASKS_EXTENSION, Task
from tasks_app.oauth import resource
from tasks_app.tools.results import new_reference


class McpError(Exception):
    code: int = -32603
    http_status: int = 200
    default_message: str = "Internal error"

    def __init__(self, message: str | None = None, *, data: Any = None) -> None:
        self.message = message or self.default_message
        self.data = data
        super().__init__(self.message)

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error

    def headers(self) -> dict[str, str]:
        return {}


class ParseError(McpError):
    code = -32700
    http_status = 400
    default_message = "Parse error: the body is not valid JSON"


class InvalidRequest(McpError):
    code = -32600
    http_status = 400
    default_message = "Invalid request"


class MethodNotFound(McpError):
    code = -32601
    http_status = 404
    default_message = "Method not found"


class InvalidParams(McpError):
    code = -32602
    http_status = 400
    default_message = "Invalid params"


class InternalError(McpError):
    code = -32603
    http_status = 200


def unexpected(exc: BaseException) -> InternalError:
    """Log EXC, a bug, with a new reference and return the -32603 that names only that
    reference: the exception's text stays in the log."""
    reference = new_reference()
    logging.getLogger("tasks_app.mcp").error(
        "MCP request failed (reference %s)", reference, exc_info=exc
    )
    return InternalError(
        f"Internal error (reference {reference}); the server log has the details",
        data={"reference": reference},
    )


class HeaderMismatch(McpError):
    """A required MCP header is missing or disagrees with the body (SEP-2243)."""

    code = -32020
    http_status = 400
    default_message = "Header mismatch"


class MissingCapability(McpError):
    """The request needs a client capability its own ``_meta`` does not declare (SEP-2575)."""

    code = -32021
    http_status = 400
    default_message = "Missing required client capability"

    def __init__(self, message: str, *, required: dict[str, Any]) -> None:
        super().__init__(message, data={"requiredCapabilities": required})


class UnsupportedVersion(McpError):
    code = -32022
    http_status = 400
    default_message = "Unsupported protocol version"

    def __init__(self, *, requested: Any, supported: list[str]) -> None:
        super().__init__(
            f"Unsupported protocol version {requested!r}; this server speaks "
            f"{', '.join(supported)}",
            data={"supported": supported, "requested": requested},
        )


def tasks_extension_required(what: str) -> MissingCapability:
    return MissingCapability(
        f"{what} requires the {TASKS_EXTENSION} extension: declare it in this request's "
        "_meta clientCapabilities.extensions",
        required={"extensions": {TASKS_EXTENSION: {}}},
    )


# --- transport-level refusals (HTTP first, with a JSON-RPC body for clients that read it) ---


class Unauthorized(McpError):
    """401 with the challenge that sends a client to the protected-resource metadata: the
    scopes to ask for when it sent no usable token, ``invalid_token`` when its token was
    refused (RFC 6750 section 3; nothing says why)."""

    code = -32600
    http_status = 401
    default_message = "Authentication required: send Authorization: Bearer <token>"

    def __init__(self, message: str | None = None, *, invalid_token: bool = False) -> None:
        super().__init__(message)
        self.invalid_token = invalid_token

    def headers(self) -> dict[str, str]:
        if self.invalid_token:
            return {"WWW-Authenticate": resource.invalid_token_challenge()}
        return {"WWW-Authenticate": resource.missing_token_challenge()}


class InsufficientScope(McpError):
    """403: the token is good but lacks the scope this request needs; the challenge names it,
    so the client can ask for it (the MCP authorization specification's step-up flow)."""

    code = -32600
    http_status = 403

    def __init__(self, *, scope: str, method: str) -> None:
        super().__init__(
            f"The access token lacks the scope {scope}, which {method} needs",
            data={"requiredScope": scope},
        )
        self.scope = scope

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": resource.insufficient_scope_challenge(self.scope)}


class ForbiddenOrigin(McpError):
    code = -32600
    http_status = 403
    default_message = "Origin not allowed"


class NotAcceptable(McpError):
    code = -32600
    http_status = 406
    default_message = (
        "Not acceptable: the Accept header must allow application/json and text/event-stream"
    )


class UnsupportedMediaType(McpError):
    code = -32600
    http_status = 415
    default_message = "Unsupported media type: send Content-Type: application/json"


class PayloadTooLarge(McpError):
    code = -32600
    http_status = 413


class MethodNotAllowed(McpError):
    code = -32600
    http_status = 405
    default_message = "Method not allowed: the MCP endpoint accepts POST only"

    def headers(self) -> dict[str, str]:
        return {"Allow": "POST"}


class RetryLater(McpError):
    """The server will not do this now; the same request may succeed later.

    HTTP 429 (this client is over a limit) or 503 (the server cannot work right now), with
    ``Retry-After`` in seconds and ``data.reason`` naming which limit or outage it was.
    Nothing was written, so a retry with the same idempotency key is safe.
    """

    code = -32000

    def __init__(
        self,
        message: str,
        *,
        reason: str,
        http_status: int,
        retry_after: float,
        data: dict[str, Any] | None = None,
    ) -> None:
        self.retry_after = max(1, math.ceil(retry_after))
        self.reason = reason
        super().__init__(
            message,
            data={"reason": reason, "retryAfterMs": self.retry_after * 1000, **(data or {})},
        )
        self.http_status = http_status

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


# HTTP status of each JSON-RPC code on the 2026-07-28 transport, as its class above says;
# anything else answers 200.
HTTP_STATUS = {
    error.code: error.http_status
    for error in (
        ParseError,
        InvalidRequest,
        MethodNotFound,
        InvalidParams,
        HeaderMismatch,
        MissingCapability,
        UnsupportedVersion,
    )
}


def from_code(code: int, message: str, data: Any = None) -> McpError:
    """An error with any JSON-RPC CODE (from a tool's ProtocolError or an AcceptanceError)."""
    error = McpError(message, data=data)
    error.code = code
    error.http_status = HTTP_STATUS.get(code, 200)
    return error


def task_failed(task: Task, meta: dict[str, Any], default: str) -> McpError:
    """The JSON-RPC error a failed TASK's call ends with: the code, message and data its tool
    or the runtime recorded (``Task.error``), META (which names the task) joined to the data,
    DEFAULT when neither the error nor the status message says anything."""
    error = task.error or {}
    data = error.get("data")
    return from_code(
        int(error.get("code", -32603)),
        str(error.get("message") or task.status_message or default),
        {**data, **meta} if isinstance(data, dict) else (data if data is not None else meta),
    )


def outage_types() -> tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]]:
    """The exceptions that mean the database (first) or the broker or cache (second) cannot
    be reached: a connection refused, dropped or timed out."""
    import kombu.exceptions
    import redis.exceptions
    from django.db import InterfaceError, OperationalError

    database: tuple[type[BaseException], ...] = (OperationalError, InterfaceError)
    services: tuple[type[BaseException], ...] = (
        kombu.exceptions.OperationalError,
        redis.exceptions.ConnectionError,
        redis.exceptions.TimeoutError,
        ConnectionError,
    )
    return database, services


def is_outage(exc: BaseException) -> bool:
    database, services = outage_types()
    return isinstance(exc, database + services)
