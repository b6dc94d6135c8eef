"""``server/discover``, the list methods and ``completion/complete``."""

from __future__ import annotations

from functools import cache
from importlib import metadata
from typing import Any

from tasks_app.mcp import catalog
from tasks_app.mcp.envelope import SERVER_INFO
from tasks_app.mcp.errors import InvalidParams
from tasks_app.mcp.methods import methods
from tasks_app.mcp.params import CompletionParams, ListParams
from tasks_app.mcp.registry import Call
from tasks_app.models import TASKS_EXTENSION, Era

SUPPORTED_VERSIONS = [Era.MODERN.value]
# Lists change only when the server is redeployed with other toolsets; they are the same for
# every client, so shared caches may keep them for a while (SEP-2549 caching hints).
LIST_TTL_MS = 300_000
LIST_CACHE_SCOPE = "public"
# A client narrowed to some tools (Client.allowed_tools) gets a list of its own: one that only
# its own authorization context may reuse.
NARROWED_CACHE_SCOPE = "private"
COMPLETION_LIMIT = 100


@cache
def server_info() -> dict[str, str]:
    try:
        version = metadata.version("taskdesk")
    except metadata.PackageNotFoundError:
        version = "0"
    return {"name": "taskdesk", "version": version}


def _cached(body: dict[str, Any]) -> dict[str, Any]:
    return {**body, "ttlMs": LIST_TTL_MS, "cacheScope": LIST_CACHE_SCOPE}


@methods.method("server/discover")
def discover(call: Call) -> dict[str, Any]:
    # Tasks are advertised as an extension, never as capabilities.tasks (SEP-2663,
    # "Capability Negotiation"); the list capabilities promise no change notifications
    # because the lists only change on redeploy (subscriptions/listen acknowledges taskIds
    # only: tasks_app.mcp.listen).
    return _cached(
        {
            "supportedVersions": SUPPORTED_VERSIONS,
            "capabilities": {
                "tools": {"listChanged": False},
                "prompts": {"listChanged": False},
                "resources": {"subscribe": False, "listChanged": False},
                "completions": {},
                "logging": {},
                "extensions": {TASKS_EXTENSION: {}},
            },
            "_meta": {SERVER_INFO: server_info()},
        }
    )


def allowed(call: Call, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """TOOLS (wire shapes) without those the caller may not call."""
    names = call.access.allowed_tools()
    return tools if names is None else [tool for tool in tools if tool["name"] in names]


# Everything fits on one page, so the cursor is accepted and ignored.
@methods.method("tools/list", params=ListParams)
def tools_list(call: Call) -> dict[str, Any]:
    listed = _cached({"tools": allowed(call, catalog.current().tools_wire)})
    if call.access.allowed_tools() is not None:
        listed["cacheScope"] = NARROWED_CACHE_SCOPE
    return listed


@methods.method("prompts/list", params=ListParams)
def prompts_list(call: Call) -> dict[str, Any]:
    return _cached({"prompts": catalog.current().prompts_wire})


@methods.method("resources/list", params=ListParams)
def resources_list(call: Call) -> dict[str, Any]:
    return _cached({"resources": catalog.current().resources_wire})


@methods.method("resources/templates/list", params=ListParams)
def resource_templates_list(call: Call) -> dict[str, Any]:
    return _cached({"resourceTemplates": catalog.current().templates_wire})


@methods.method("completion/complete", params=CompletionParams)
def complete(call: Call) -> dict[str, Any]:
    ref, argument = call.data["ref"], call.data["argument"]
    values: list[str] = []
    if ref["type"] == "ref/prompt":
        prompt = catalog.current().prompts.get(ref.get("name", ""))
        if prompt is None:
            raise InvalidParams(f"Unknown prompt: {ref.get('name')!r}")
        if prompt.complete is not None:
            values = list(prompt.complete(argument["name"], argument["value"]))
    total = len(values)
    return {
        "completion": {
            "values": values[:COMPLETION_LIMIT],
            "total": total,
            "hasMore": total > COMPLETION_LIMIT,
        }
    }
