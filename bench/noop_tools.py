"""The no-op tool of the runtime benchmark (``TASKDESK_TOOLSETS=...,bench.noop_tools``)."""

from __future__ import annotations

from tasks_app.tools import ToolContext, Toolset

tools = Toolset("bench")


@tools.tool(task="required")
def noop(ctx: ToolContext) -> str:
    """Do nothing, as a task."""
    return "ok"
