"""Client bearer tokens: generated from the OS CSPRNG, stored only as a keyed hash.

A token carries 256 random bits, so a fast keyed hash (HMAC-SHA-256 through Django's
``salted_hmac``) is the right tool: nothing to brute-force, and lookups stay one indexed
equality match. Rotating SECRET_KEY invalidates every token.
"""

from __future__ import annotations

import secrets

from django.utils import timezone
from django.utils.crypto import salted_hmac

from tasks_app.models import Client, ClientToken

TOKEN_PREFIX = "tdk_"
_SALT = "taskdesk.client-token"


def hash_token(token: str) -> str:
    return salted_hmac(_SALT, token, algorithm="sha256").hexdigest()


def issue(client: Client) -> str:
    """Create a new token for CLIENT and return it; only its hash is kept."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    ClientToken.objects.create(
        client=client, token_hash=hash_token(token), prefix=token[: len(TOKEN_PREFIX) + 6]
    )
    return token


def revoke_all(client: Client) -> int:
    return ClientToken.objects.filter(client=client, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )


def client_for_token(token: str) -> Client | None:
    """Return the client owning TOKEN, or None if it is unknown or revoked."""
    if not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    row = (
        ClientToken.objects.select_related("client__tenant")
        .filter(token_hash=hash_token(token), revoked_at__isnull=True)
        .first()
    )
    return row.client if row else None
