"""Taskdesk's built-in OAuth 2.1 authorization server, for the embedded default and for teams
without an identity provider: MCP clients sign a person in here and get tokens for /mcp.

Built on Authlib (``authlib.oauth2``), not django-oauth-toolkit. Authlib leaves the storage
to the application, which the MCP authorization specification needs: tokens and codes are
stored only as keyed hashes (django-oauth-toolkit keeps access and refresh tokens in clear
text in its own swappable models), every code and token carries its RFC 8707 resource, and
an app may be a client ID metadata document URL, longer than django-oauth-toolkit's
``client_id`` column. Authlib also brings dynamic client registration (RFC 7591), token
revocation (RFC 7009) and PKCE, which django-oauth-toolkit lacks or only partly has.

``server`` (grants, PKCE S256, resources), ``documents`` (client ID metadata documents),
``registration`` (RFC 7591), ``approvals`` (the consent page's tenants and grants),
``metadata`` (RFC 8414) and ``views``. The resource server's side, which verifies the tokens
on /mcp, is ``tasks_app.oauth`` (``builtin.verify``).
"""
