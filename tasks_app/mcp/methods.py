"""The method tables of the two wires: each handler module registers its methods on
``methods`` (2026-07-28) or ``handshake_methods`` (2025-11-25), or on both where one function
serves both; ``tasks_app.mcp.handlers`` imports them all."""

from __future__ import annotations

from tasks_app.mcp.registry import MethodRegistry

methods = MethodRegistry()
handshake_methods = MethodRegistry()
