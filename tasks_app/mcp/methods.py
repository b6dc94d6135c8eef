"""The method table of the 2026-07-28 wire: each handler module registers its methods on
``methods``; ``tasks_app.mcp.handlers`` imports them all."""

from __future__ import annotations

from tasks_app.mcp.registry import MethodRegistry

methods = MethodRegistry()
