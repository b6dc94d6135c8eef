"""The conformance suite's tools: content types, tasks, questions, progress and logs."""

from __future__ import annotations

import base64
import io
import json
import struct
import wave
import zlib
from typing import Any

from tasks_app.tools import ProtocolError, Question, ToolContext, ToolError, ToolResult, Toolset
from tasks_app.tools.results import text

tools = Toolset("conformance")

# The one-checkbox form the MRTR fixtures ask for.
CONFIRM_FORM = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


def _png() -> bytes:
    """A 1x1 red PNG, built here so the fixture carries no opaque blob."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)  # 1x1, 8-bit RGB
    pixels = zlib.compress(b"\x00\xff\x00\x00")  # filter byte, then one red pixel
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    )


def _wav() -> bytes:
    """A tenth of a second of silence, 8 kHz mono 16-bit."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(8000)
        out.writeframes(b"\x00\x00" * 800)
    return buffer.getvalue()


PNG = _png()
PNG_B64 = base64.b64encode(PNG).decode()
WAV_B64 = base64.b64encode(_wav()).decode()
IMAGE = {"type": "image", "data": PNG_B64, "mimeType": "image/png"}

NAME_FORM = {
    "type": "object",
    "properties": {"name": {"type": "string", "description": "Your name"}},
    "required": ["name"],
}


def text_form(field: str) -> dict[str, Any]:
    """A form of one required, undescribed text FIELD."""
    return {"type": "object", "properties": {field: {"type": "string"}}, "required": [field]}


def ask_name_and_greet(ctx: ToolContext) -> str:
    """Ask for the user's name and greet them by it (by the action, when they gave none)."""
    answer = ctx.ask("user_name", message="What is your name?", schema=NAME_FORM)
    return f"Hello, {answer.content.get('name', answer.action)}!"


# The first tool listed must answer a call with no arguments: the suite's header checks
# call whichever tool tools/list shows first with {}.
@tools.tool
def test_simple_text(ctx: ToolContext) -> str:
    """Return a simple text."""
    return "This is a simple text response for testing."


# --- tasks extension (SEP-2663) --------------------------------------------------------


@tools.tool
def greet(ctx: ToolContext, name: str) -> str:
    """Greet NAME (always synchronous)."""
    return f"Hello, {name}!"


@tools.tool(task="optional")
def slow_compute(ctx: ToolContext, seconds: float = 1.0, label: str = "") -> str:
    """Wait SECONDS (checking for cancellation), then report that LABEL is done."""
    ctx.sleep(seconds, every=0.1)
    return f"{label or 'computation'} finished after {seconds:g} s"


@tools.tool(task="required")
def failing_job(ctx: ToolContext) -> str:
    """Work for about a second, then fail with a tool error."""
    ctx.sleep(1.0, every=0.1)
    raise ToolError("failing_job always fails: this is the tool error the test expects")


@tools.tool(task="optional")
def protocol_error_job(ctx: ToolContext) -> str:
    """End with a JSON-RPC error instead of a result."""
    ctx.sleep(0.2, every=0.1)
    raise ProtocolError("protocol_error_job failed on purpose", code=-32603)


@tools.tool(task="optional")
def confirm_delete(ctx: ToolContext, filename: str) -> str:
    """Ask the client to confirm before pretending to delete FILENAME."""
    answer = ctx.ask(
        "confirm",
        message=f"Delete {filename}?",
        schema={
            "type": "object",
            "properties": {"confirm": {"type": "boolean", "title": "Delete it"}},
            "required": ["confirm"],
        },
    )
    if answer.accepted and answer.content.get("confirm"):
        return f"Deleted {filename}"
    return f"Kept {filename}"


@tools.tool(task="optional")
def multi_input(ctx: ToolContext) -> str:
    """Ask two questions at once; each may be answered separately."""
    form = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "confirm": {"type": "boolean"}},
    }
    answers = ctx.ask_many(
        {
            "first": Question(message="First?", schema=form),
            "second": Question(message="Second?", schema=form),
        }
    )
    names = [answers[k].content.get("name", answers[k].action) for k in ("first", "second")]
    return f"Got {names[0]} and {names[1]}"


@tools.tool(task="required", escalate=True)
def test_tool_with_task(ctx: ToolContext) -> str:
    """Ask for a name synchronously, then finish as a task that uses the answer."""
    answer = ctx.ask("user_name", message="What is your name?", schema=NAME_FORM)
    ctx.escalate()
    ctx.sleep(0.2, every=0.1)
    return f"Hello, {answer.content.get('name', 'stranger')}! (finished as a task)"


# --- content, errors, progress, logging -------------------------------------------------


@tools.tool
def test_image_content(ctx: ToolContext) -> Any:
    """Return a PNG image."""
    return ToolResult(content=[IMAGE])


@tools.tool
def test_audio_content(ctx: ToolContext) -> Any:
    """Return a WAV clip."""
    return ToolResult(content=[{"type": "audio", "data": WAV_B64, "mimeType": "audio/wav"}])


@tools.tool
def test_embedded_resource(ctx: ToolContext) -> Any:
    """Return an embedded text resource."""
    resource = {
        "uri": "test://embedded-resource",
        "mimeType": "text/plain",
        "text": "This is an embedded resource content.",
    }
    return ToolResult(content=[{"type": "resource", "resource": resource}])


@tools.tool
def test_multiple_content_types(ctx: ToolContext) -> Any:
    """Return text, an image and an embedded resource together."""
    resource = {
        "uri": "test://mixed-content-resource",
        "mimeType": "application/json",
        "text": json.dumps({"test": "data", "value": 123}),
    }
    return ToolResult(
        content=[
            text("Multiple content types test:"),
            IMAGE,
            {"type": "resource", "resource": resource},
        ]
    )


@tools.tool
def test_error_handling(ctx: ToolContext) -> str:
    """Always fail with a tool error (isError, not a JSON-RPC error)."""
    raise ToolError("This tool intentionally returns an error for testing")


@tools.tool
def test_tool_with_progress(ctx: ToolContext) -> str:
    """Report progress 0, 50 and 100 of 100."""
    for done in (0, 50, 100):
        ctx.progress(done, 100, f"{done}% done")
        ctx.sleep(0.05)
    return "Progress test completed"


@tools.tool
def test_tool_with_logging(ctx: ToolContext) -> str:
    """Send three log lines while running."""
    for step in ("Tool execution started", "Tool processing data", "Tool execution completed"):
        ctx.log("info", step)
        ctx.sleep(0.05)
    return "Logging test completed"


@tools.tool
def test_logging_tool(ctx: ToolContext) -> str:
    """Log a line (sent only to clients that set a log level)."""
    ctx.log("info", "test_logging_tool ran")
    return "Logged one line"


@tools.tool
def test_missing_capability(ctx: ToolContext) -> str:
    """Needs sampling: without it the call is refused with -32021."""
    result = ctx.request_input(
        "sample",
        "sampling/createMessage",
        {
            "messages": [{"role": "user", "content": {"type": "text", "text": "Say hi"}}],
            "maxTokens": 20,
        },
    )
    return f"Sampled: {sampled_text(result)}"


@tools.tool
def test_streaming_elicitation(ctx: ToolContext) -> str:
    """Ask for a name (as an input_required result, never a request on the stream)."""
    ctx.progress(0, 1, "asking")
    return ask_name_and_greet(ctx)


@tools.tool
def test_sampling(ctx: ToolContext, prompt: str) -> str:
    """Ask the client's model to answer PROMPT."""
    result = ctx.request_input(
        "sampling",
        "sampling/createMessage",
        {
            "messages": [{"role": "user", "content": {"type": "text", "text": prompt}}],
            "maxTokens": 100,
        },
    )
    return f"LLM response: {sampled_text(result)}"


@tools.tool
def test_elicitation(ctx: ToolContext, message: str) -> str:
    """Ask the user MESSAGE with a small form."""
    answer = ctx.ask(
        "response",
        message=message,
        schema={
            "type": "object",
            "properties": {
                "username": {"type": "string", "description": "User's response"},
                "email": {"type": "string", "description": "User's email address"},
            },
            "required": ["username", "email"],
        },
    )
    return f"User response: action={answer.action}, content={json.dumps(answer.content)}"


# A synchronous call that outlives its stream (SEP-1699): the call runs as a durable task,
# the server closes the POST stream after its priming event, and the client gets the
# response on the GET it resumes with Last-Event-ID.
@tools.tool(task="optional", durable_sync=True, stream_seconds=0.3)
def test_reconnection(ctx: ToolContext) -> str:
    """Run for about a second and a half, longer than the server holds the call's stream."""
    ctx.sleep(1.5, every=0.1)
    return "Reconnection test completed: the response came after the stream was resumed"


@tools.tool
def test_elicitation_sep1034_defaults(ctx: ToolContext) -> str:
    """Ask with a form whose fields all carry defaults (SEP-1034)."""
    answer = ctx.ask(
        "defaults",
        message="Please review and update the form fields with defaults",
        schema={
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "User name", "default": "John Doe"},
                "age": {"type": "integer", "description": "User age", "default": 30},
                "score": {"type": "number", "description": "User score", "default": 95.5},
                "status": {
                    "type": "string",
                    "description": "User status",
                    "enum": ["active", "inactive", "pending"],
                    "default": "active",
                },
                "verified": {"type": "boolean", "description": "Verified", "default": True},
            },
        },
    )
    return f"Elicitation completed: action={answer.action}, content={json.dumps(answer.content)}"


@tools.tool
def test_elicitation_sep1330_enums(ctx: ToolContext) -> str:
    """Ask with the five enum variants of SEP-1330."""
    answer = ctx.ask(
        "enums",
        message="Please select options from the enum fields",
        schema={
            "type": "object",
            "properties": {
                "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
                "titledSingle": {
                    "type": "string",
                    "oneOf": [
                        {"const": "value1", "title": "First Option"},
                        {"const": "value2", "title": "Second Option"},
                    ],
                },
                "legacyEnum": {
                    "type": "string",
                    "enum": ["opt1", "opt2"],
                    "enumNames": ["Option One", "Option Two"],
                },
                "untitledMulti": {
                    "type": "array",
                    "items": {"type": "string", "enum": ["option1", "option2", "option3"]},
                },
                "titledMulti": {
                    "type": "array",
                    "items": {
                        "anyOf": [
                            {"const": "value1", "title": "First Choice"},
                            {"const": "value2", "title": "Second Choice"},
                        ]
                    },
                },
            },
        },
    )
    return f"Elicitation completed: action={answer.action}, content={json.dumps(answer.content)}"


@tools.tool(
    input_schema={
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "$defs": {
            "address": {
                "$anchor": "addressDef",
                "type": "object",
                "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
            }
        },
        "properties": {
            "name": {"type": "string"},
            "address": {"$ref": "#/$defs/address"},
            "contactMethod": {"type": "string", "enum": ["phone", "email"]},
            "phone": {"type": "string"},
            "email": {"type": "string"},
        },
        "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
        "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
        "then": {"required": ["phone"]},
        "else": {"required": ["email"]},
        "additionalProperties": False,
    }
)
def json_schema_2020_12_tool(ctx: ToolContext, **arguments: Any) -> str:
    """Echo arguments validated by a JSON Schema 2020-12 input schema."""
    return f"JSON Schema 2020-12 tool called with: {json.dumps(arguments, sort_keys=True)}"


@tools.tool(
    input_schema={
        "type": "object",
        "properties": {
            "region": {
                "type": "string",
                "description": "Mirrored in the Mcp-Param-Region header for routing",
                "x-mcp-header": "Region",
            }
        },
        "required": ["region"],
    }
)
def test_routed_by_header(ctx: ToolContext, region: str) -> str:
    """Echo REGION, which clients also send in the Mcp-Param-Region header."""
    return f"Routed to {region}"


def sampled_text(result: dict[str, Any]) -> str:
    content = result.get("content")
    if isinstance(content, list):
        content = content[0] if content else {}
    text = content.get("text") if isinstance(content, dict) else None
    return text if isinstance(text, str) else "(no text)"
