"""Turning what a tool function returns into an MCP ``CallToolResult`` (a JSON dict).

- ``str`` → one text content block.
- ``ToolResult`` → exactly the content, structured content and error flag it carries.
- a dict, a pydantic model, a list or a number → ``structuredContent`` (a non-object is
  wrapped as ``{"result": value}``) plus a text block holding the same JSON.
- ``None`` → an empty text block.
A ``ToolError`` raised by the tool becomes ``isError: true`` with its message. Any other
exception becomes ``isError: true`` naming only a reference (``unexpected_error_result``): its
text, which may hold anything the tool had in hand, goes to the log under that reference.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import pydantic


@dataclass
class ToolResult:
    content: list[dict[str, Any]] = field(default_factory=list)
    structured: dict[str, Any] | None = None
    is_error: bool = False
    meta: dict[str, Any] | None = None


def new_reference() -> str:
    """A short random id that ties what a client is told to the server's log line."""
    return secrets.token_hex(6)


def unexpected_error_result(reference: str) -> dict[str, Any]:
    return error_result(
        f"The tool failed unexpectedly (reference {reference}); the server log has the details"
    )


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


def for_tool(name: str, output_schema: dict[str, Any] | None, value: Any) -> dict[str, Any]:
    """Convert what tool NAME's function returned, checking it can be stored and sent.

    A value that is not JSON (or holds NaN or infinities), or structured content that does
    not match the tool's output schema, becomes an ``isError`` result that says so: a client
    must never receive structured content that contradicts the schema the tool advertised.
    """
    try:
        result = to_call_tool_result(value)
        json.dumps(result, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return error_result(f"Tool {name} returned a value that is not valid JSON: {exc}")
    if output_schema is None or result.get("isError"):
        return result
    structured = result.get("structuredContent")
    if structured is None:
        return error_result(
            f"Tool {name} declares an output schema but returned no structured content"
        )
    errors = sorted(
        jsonschema.Draft202012Validator(output_schema).iter_errors(structured),
        key=lambda e: list(e.path),
    )
    if errors:
        where = ".".join(str(p) for p in errors[0].path) or "structuredContent"
        return error_result(
            f"Tool {name} returned structured content that does not match its output "
            f"schema: {where}: {errors[0].message}"
        )
    return result
