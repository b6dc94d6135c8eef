"""Fixtures the official MCP conformance suite calls by name (TASKDESK_TOOLSETS=conformance)."""

from __future__ import annotations

from tasks_app.tools import Toolset

tools = Toolset("conformance")
