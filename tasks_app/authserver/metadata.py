"""The built-in server's metadata (RFC 8414), at ``/.well-known/oauth-authorization-server``.

Only the OAuth path is served: MCP clients try it first and use it when it answers (the
MCP authorization specification, "Authorization Server Metadata Discovery"); the OpenID
Connect path would claim an OpenID provider, which this server is not (it issues no ID
tokens).
"""

from __future__ import annotations

from typing import Any

from django.urls import reverse

from tasks_app.oauth import resource
from tasks_app.oauth.access import SCOPES

AUTH_METHODS = ["none", "client_secret_basic", "client_secret_post"]


def server_metadata() -> dict[str, Any]:
    base = resource.builtin_issuer()
    return {
        "issuer": base,
        "authorization_endpoint": base + reverse("oauth_authorize"),
        "token_endpoint": base + reverse("oauth_token"),
        "registration_endpoint": base + reverse("oauth_register"),
        "revocation_endpoint": base + reverse("oauth_revoke"),
        "scopes_supported": list(SCOPES),
        "response_types_supported": ["code"],
        "response_modes_supported": ["query"],
        "grant_types_supported": ["authorization_code", "refresh_token"],
        "token_endpoint_auth_methods_supported": AUTH_METHODS,
        "revocation_endpoint_auth_methods_supported": AUTH_METHODS,
        "code_challenge_methods_supported": ["S256"],
        "authorization_response_iss_parameter_supported": True,
        "client_id_metadata_document_supported": True,
    }
