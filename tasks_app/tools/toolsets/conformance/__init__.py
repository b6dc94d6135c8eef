"""Fixtures the official MCP conformance suite calls by name (TASKDESK_TOOLSETS=conformance).

Written with the same public API any tool author uses; the protocol code knows nothing
about them. The suite checks names, shapes and a few exact texts (``greet``), so the texts
here follow the suite's reference fixtures where it compares them.

One module a kind of fixture: ``fixtures`` (tools), ``mrtr`` (input_required results) and
``catalog`` (prompts and resources), all registered on the one ``tools`` toolset.
"""

from __future__ import annotations

from tasks_app.tools.toolsets.conformance import catalog, mrtr
from tasks_app.tools.toolsets.conformance.fixtures import tools

__all__ = ["catalog", "mrtr", "tools"]
