"""The MCP endpoint: transport, protocol eras, method handlers and the synchronous context.

``views.McpView`` is mounted at ``/mcp``; ``eras`` picks the wire a message speaks
(``modern``: 2026-07-28 with the tasks extension); ``handlers`` holds one module per group
of methods; ``sync.SyncContext`` runs tools inside the request with MRTR rounds.
"""
