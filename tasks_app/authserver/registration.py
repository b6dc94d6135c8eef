"""Dynamic client registration (RFC 7591, ``POST /oauth/register``), for MCP clients that know
no other way to get a ``client_id`` (the MCP specification keeps it for them; client ID
metadata documents are preferred).

Registration is open, as MCP clients need it to be, and bounded: each client address may
register ``TASKDESK_OAUTH_REGISTRATIONS_PER_HOUR`` apps an hour. Redirect URIs must pass
``redirects.check_redirect_uri``. An app that asks for ``none`` (public, PKCE only) gets no
secret; one that asks for ``client_secret_basic`` or ``client_secret_post`` gets a secret,
shown once and stored only as a keyed hash.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from authlib.oauth2.rfc7591 import (
    ClientMetadataClaims,
    ClientRegistrationEndpoint,
    InvalidClientMetadataError,
    InvalidRedirectURIError,
)
from django.conf import settings
from django.core.cache import cache

from tasks_app.authserver import metadata
from tasks_app.models import OAuthApp
from tasks_app.oauth import builtin
from tasks_app.oauth.redirects import RedirectRefused, check_redirect_uri, redirect_host

NAME_MAX = 200


class Claims(ClientMetadataClaims):  # type: ignore[misc]  # Authlib is untyped
    def validate_redirect_uris(self) -> None:
        uris = self.get("redirect_uris")
        if not isinstance(uris, list) or not uris:
            raise InvalidRedirectURIError("redirect_uris is required: a list of URIs.")
        for uri in uris:
            if not isinstance(uri, str):
                raise InvalidRedirectURIError("Each redirect URI must be a string.")
            try:
                check_redirect_uri(uri)
            except RedirectRefused as exc:
                raise InvalidRedirectURIError(f"Refused: {exc}.") from None

    def validate_token_endpoint_auth_method(self) -> None:
        # Omitted: a public client (RFC 7591 says client_secret_basic, but MCP clients that
        # omit it use PKCE without a secret).
        self.setdefault("token_endpoint_auth_method", "none")


class Registration(ClientRegistrationEndpoint):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__(claims_classes=[Claims])

    def authenticate_token(self, request: Any) -> bool:
        return True  # open registration, bounded per address by the view

    def get_server_metadata(self) -> dict[str, Any]:
        return metadata.server_metadata()

    def generate_client_info(self, request: Any) -> dict[str, Any]:
        info: dict[str, Any] = {
            "client_id": "tdapp_" + secrets.token_urlsafe(24),
            "client_id_issued_at": int(time.time()),
        }
        if request.payload.data.get("token_endpoint_auth_method", "none") != "none":
            info.update(client_secret=secrets.token_urlsafe(32), client_secret_expires_at=0)
        return info

    def save_client(
        self, client_info: dict[str, Any], client_metadata: dict[str, Any], request: Any
    ) -> OAuthApp:
        uris = client_metadata["redirect_uris"]
        name = client_metadata.get("client_name")
        if name is not None and not isinstance(name, str):
            raise InvalidClientMetadataError("client_name must be a string.")
        shown = "".join(c for c in (name or "") if c.isprintable()).strip()[:NAME_MAX]
        secret = client_info.get("client_secret")
        return OAuthApp.objects.create(
            client_id=client_info["client_id"],
            name=shown or f"An app at {redirect_host(uris[0])}",
            kind=OAuthApp.Kind.DYNAMIC,
            redirect_uris=uris,
            client_secret_hash=builtin.hash_secret(secret) if secret else "",
            token_endpoint_auth_method=client_metadata["token_endpoint_auth_method"],
            client_uri=str(client_metadata.get("client_uri", ""))[:1000],
        )


def allowed(address: str) -> bool:
    """Count one registration from ADDRESS; False once it has made its hour's share."""
    key = f"taskdesk:oauth-registrations:{address}:{int(time.time() // 3600)}"
    if cache.add(key, 1, timeout=3600):
        return True
    try:
        count = cache.incr(key)
    except ValueError:  # expired between add and incr
        cache.add(key, 1, timeout=3600)
        return True
    return bool(count <= settings.TASKDESK_OAUTH_REGISTRATIONS_PER_HOUR)
