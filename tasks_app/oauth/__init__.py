"""OAuth 2.1 for MCP clients (the 2026-07-28 authorization specification): Taskdesk as a
resource server (protected-resource metadata, challenges, scopes, external issuers' JWTs) and
as a built-in authorization server. ``bearer.verify`` turns an access token into an ``Access``
(``access``); it asks ``builtin`` and ``issuers``, which both build ``Access`` objects, so it
lives in a module of its own rather than in ``access``.
"""
