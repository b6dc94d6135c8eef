"""``resources/read``."""

from __future__ import annotations

import base64
from typing import Any

from tasks_app.mcp import catalog
from tasks_app.mcp.errors import InvalidParams
from tasks_app.mcp.handlers.discovery import LIST_CACHE_SCOPE, LIST_TTL_MS
from tasks_app.mcp.methods import methods
from tasks_app.mcp.params import ResourcesReadParams
from tasks_app.mcp.registry import Call


@methods.method("resources/read", params=ResourcesReadParams, name_param="uri")
def resources_read(call: Call) -> dict[str, Any]:
    uri = call.data["uri"]
    try:
        read, mime_type, variables = catalog.current().resource_for(uri)
    except KeyError:
        # 2026-07-28 answers an unknown resource with -32602 and data.uri (SEP-2164).
        raise InvalidParams(f"Resource not found: {uri}", data={"uri": uri}) from None
    body = read(**variables)
    content: dict[str, Any] = {"uri": uri, "mimeType": mime_type}
    if isinstance(body, bytes):
        content["blob"] = base64.b64encode(body).decode()
    else:
        content["text"] = body
    return {"contents": [content], "ttlMs": LIST_TTL_MS, "cacheScope": LIST_CACHE_SCOPE}
