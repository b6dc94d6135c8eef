"""The methods of the 2026-07-28 wire, registered on ``methods``."""

from __future__ import annotations

from tasks_app.mcp.registry import MethodRegistry

methods = MethodRegistry()

# Registration happens on import; the order does not matter.
from tasks_app.mcp.handlers import (  # noqa: E402
    discovery,
    prompts,
    resources,
    tasks,
    tools,
)

__all__ = ["discovery", "methods", "prompts", "resources", "tasks", "tools"]
