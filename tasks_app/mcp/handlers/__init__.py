"""The methods of the 2026-07-28 wire. Importing this package registers every handler on
``tasks_app.mcp.methods.methods``; the order does not matter."""

from __future__ import annotations

from tasks_app.mcp.handlers import discovery, prompts, resources, tasks, tools

__all__ = ["discovery", "prompts", "resources", "tasks", "tools"]
