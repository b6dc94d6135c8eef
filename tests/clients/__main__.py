"""``python -m tests.clients``: install the clients the integration tests drive (the FastMCP
virtualenv, the npm packages) ahead of a run, as CI does, and print where they are."""

from __future__ import annotations

from tests.clients import fastmcp_python, node

print(fastmcp_python())
print(node())
