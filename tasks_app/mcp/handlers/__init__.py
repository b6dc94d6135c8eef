"""The methods of both wires. Importing this package registers every handler on
``tasks_app.mcp.methods.methods`` (2026-07-28) and ``handshake_methods`` (2025-11-25); the
order does not matter."""

from __future__ import annotations

from tasks_app.mcp.handlers import discovery, handshake, prompts, resources, tasks, tools

__all__ = ["discovery", "handshake", "prompts", "resources", "tasks", "tools"]
