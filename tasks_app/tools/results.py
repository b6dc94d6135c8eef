"""Turning what a tool function returns into an MCP ``CallToolResult`` (a JSON dict).

- ``str`` → one text content block.
- ``ToolResult`` → exactly the content, structured content and error flag it carries.
- a dict, a pydantic model, a list or a number → ``structuredContent`` (a non-object is
  wrapped as ``{"result": value}``) plus a text block holding the same JSON.
- ``None`` → an empty text block.
A ``ToolError`` raised by the tool becomes ``isError: true`` with its message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pydantic


@dataclass
class ToolResult:
    content: list[dict[str, Any]] = field(default_factory=list)
    structured: dict[str, Any] | None = None
    is_error: bool = False
    meta: dict[str, Any] | None = None


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def to_call_tool_result(value: Any) -> dict[str, Any]:
    if isinstance(value, ToolResult):
        out: dict[str, Any] = {"content": value.content, "isError": value.is_error}
        if value.structured is not None:
            out["structuredContent"] = value.structured
        if value.meta:
            out["_meta"] = value.meta
        return out
    if value is None:
        return {"content": [text("")], "isError": False}
    if isinstance(value, str):
        return {"content": [text(value)], "isError": False}
    if isinstance(value, pydantic.BaseModel):
        value = value.model_dump(mode="json")
    structured = value if isinstance(value, dict) else {"result": value}
    return {
        "content": [text(json.dumps(value, ensure_ascii=False, sort_keys=True))],
        "structuredContent": structured,
        "isError": False,
    }


def error_result(message: str) -> dict[str, Any]:
    return {"content": [text(message)], "isError": True}
