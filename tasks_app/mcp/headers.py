"""Reading MCP request headers (SEP-2243, "HTTP Header Standardization")."""

from __future__ import annotations

import base64
import binascii
import json
from functools import lru_cache
from typing import Any

from rest_framework.request import Request

from tasks_app.mcp.errors import HeaderMismatch


@lru_cache(maxsize=64)
def _meta_key(name: str) -> str:
    key = name.upper().replace("-", "_")
    return key if key in ("CONTENT_TYPE", "CONTENT_LENGTH") else f"HTTP_{key}"


def sent(request: Any, name: str) -> str | None:
    """Header NAME as sent, or None: what ``request.headers.get(name)`` answers, read from
    the WSGI environ directly. ``request.headers`` builds a mapping of every header first,
    which cost an MCP request more than all its reads of it."""
    http_request = getattr(request, "_request", request)  # under DRF's Request
    value: str | None = http_request.META.get(_meta_key(name))
    return value


def header(request: Request, name: str) -> str | None:
    """A header value with surrounding whitespace removed (RFC 9110 §5.5), decoding the
    ``=?base64?...?=`` form SEP-2243 uses for values that are not plain ASCII. A value
    without both the prefix and the suffix is literal."""
    raw = sent(request, name)
    if raw is None:
        return None
    value = raw.strip(" \t")
    if value.startswith("=?base64?") and value.endswith("?=") and len(value) >= 11:
        try:
            return base64.b64decode(value[9:-2], validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            raise HeaderMismatch(
                f"The {name} header holds invalid base64 inside =?base64?...?="
            ) from None
    return value


def header_text(value: Any) -> str | None:
    """How an argument value appears in its ``Mcp-Param-*`` header (None: not mirrored)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool | int | float):
        return json.dumps(value)
    return None


def check_param_headers(
    request: Request, mirrored: tuple[tuple[str, str], ...], arguments: dict[str, Any]
) -> None:
    """Raise HeaderMismatch unless every argument the tool mirrors into an ``Mcp-Param-*``
    header (``x-mcp-header`` in its input schema) is sent in that header with the same value."""
    for argument, suffix in mirrored:
        expected = header_text(arguments.get(argument))
        if expected is None:
            continue
        name = f"Mcp-Param-{suffix}"
        if header(request, name) != expected:
            raise HeaderMismatch(
                f"The {name} header must be present and equal arguments.{argument}"
            )
