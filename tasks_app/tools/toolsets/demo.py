"""The demo toolset (on by default): tools for trying Taskdesk and for its tests."""

from __future__ import annotations

from tasks_app.tools import ToolContext, Toolset

tools = Toolset("demo")


@tools.tool(task="optional")
def slow_echo(ctx: ToolContext, text: str, seconds: float = 5) -> str:
    """Echo TEXT back after SECONDS, checking for cancellation every 0.2 s."""
    ctx.sleep(seconds, every=0.2)
    return text
