"""The MCP endpoint as an OAuth protected resource: its canonical URI (RFC 8707), its
metadata document and that document's address (RFC 9728), and the ``WWW-Authenticate``
challenges of its 401 and 403 answers (RFC 6750; the MCP authorization specification's
"Scope Challenge Handling").

The canonical URI is ``TASKDESK_PUBLIC_URL`` with the endpoint's path: an access token is
accepted only when its audience is that URI, compared after ``normalized`` on both sides.
"""

from __future__ import annotations

from functools import cache
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings

from tasks_app.oauth.access import SCOPES

# The MCP endpoint's path (tasks_app.mcp.views serves it; config/urls.py routes it).
MCP_PATH = "/mcp"
# RFC 9728 section 3: the well-known prefix, inserted between the host and the resource's path.
METADATA_PREFIX = "/.well-known/oauth-protected-resource"
# The scopes a client without a token is told to ask for: everything the endpoint serves.
CHALLENGE_SCOPES = " ".join(SCOPES)


_DEFAULT_PORTS = {"http": 80, "https": 443}


def normalized(uri: str) -> str:
    """URI as resource identifiers are compared: scheme and host in lower case, the default
    port left out, no trailing slash, no fragment (RFC 8707 section 2; the MCP
    specification's "Canonical Server URI"); "" for what is not a URI with a host."""
    try:
        parts = urlsplit(uri.strip())
        port = parts.port
    except ValueError:
        return ""
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    if not scheme or not host:
        return ""
    if ":" in host:
        host = f"[{host}]"
    if port is not None and port != _DEFAULT_PORTS.get(scheme):
        host = f"{host}:{port}"
    return urlunsplit((scheme, host, parts.path.rstrip("/"), parts.query, ""))


def resource_uri() -> str:
    """The canonical URI of the MCP endpoint, the audience its access tokens must name."""
    return _uris(settings.TASKDESK_PUBLIC_URL)[0]


def metadata_url() -> str:
    """The address of the endpoint's protected-resource metadata (its path-suffixed form)."""
    return _uris(settings.TASKDESK_PUBLIC_URL)[1]


@cache
def _uris(public_url: str) -> tuple[str, str]:
    resource = normalized(public_url.rstrip("/") + MCP_PATH)
    parts = urlsplit(resource)
    metadata = urlunsplit((parts.scheme, parts.netloc, METADATA_PREFIX + parts.path, "", ""))
    return resource, metadata


def builtin_issuer() -> str:
    """The issuer identifier of Taskdesk's own authorization server."""
    return str(settings.TASKDESK_PUBLIC_URL).rstrip("/")


def authorization_servers() -> list[str]:
    """The issuers whose access tokens the endpoint accepts, the built-in server first."""
    servers = [builtin_issuer()] if settings.TASKDESK_OAUTH_SERVER else []
    servers.extend(issuer.issuer for issuer in settings.TASKDESK_OAUTH_ISSUERS)
    return servers


def metadata() -> dict[str, Any]:
    """The protected-resource metadata document (RFC 9728 section 2)."""
    return {
        "resource": resource_uri(),
        "authorization_servers": authorization_servers(),
        "scopes_supported": list(SCOPES),
        "bearer_methods_supported": ["header"],
        "resource_name": "Taskdesk",
    }


# --- challenges --------------------------------------------------------------------------------


def missing_token_challenge() -> str:
    """401 without a usable token: where to learn how to get one, and what to ask for."""
    return f'Bearer resource_metadata="{metadata_url()}", scope="{CHALLENGE_SCOPES}"'


def invalid_token_challenge() -> str:
    """401 for a token that is not accepted (unknown, expired, revoked, for another resource
    or from another issuer): the RFC 6750 error code and nothing more."""
    return f'Bearer error="invalid_token", resource_metadata="{metadata_url()}"'


def insufficient_scope_challenge(scope: str) -> str:
    """403 for a token without SCOPE: the scope to ask for in a step-up authorization."""
    return (
        f'Bearer error="insufficient_scope", scope="{scope}", resource_metadata="{metadata_url()}"'
    )
