"""Client bearer tokens: generated from the OS CSPRNG, stored only as a keyed hash.

A token carries 256 random bits, so a fast keyed hash (HMAC-SHA-256 through Django's
``salted_hmac``) is the right tool: nothing to brute-force, and lookups stay one indexed
equality match. Rotating SECRET_KEY invalidates every token.
"""

from __future__ import annotations

import secrets
import threading
import time

from django.conf import settings
from django.utils import timezone
from django.utils.crypto import salted_hmac

from tasks_app.models import Client, ClientToken

TOKEN_PREFIX = "tdk_"
_SALT = "taskdesk.client-token"


def hash_token(token: str) -> str:
    return salted_hmac(_SALT, token, algorithm="sha256").hexdigest()


def issue(client: Client) -> str:
    """Create a new token for CLIENT and return it; only its hash is kept."""
    row = ClientToken(client=client)
    token = fill(row)
    row.save()
    return token


def fill(row: ClientToken) -> str:
    """Give ROW (not saved yet) a new token's hash and prefix, and return the token."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row.token_hash = hash_token(token)
    row.prefix = token[: len(TOKEN_PREFIX) + 6]
    return token


def revoke_all(client: Client) -> int:
    count = ClientToken.objects.filter(client=client, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )
    forget_cached()
    return count


# Every MCP request authenticates, and the lookup was the largest part of a request's cost,
# so each process remembers recent positive answers for TASKDESK_TOKEN_CACHE_SECONDS. A
# revocation therefore takes effect in other processes within that many seconds (at once in
# the revoking process). Unknown tokens are never cached, so a new token works at once.
_recent: dict[str, tuple[float, Client]] = {}
_recent_lock = threading.Lock()
_RECENT_MAX = 10_000


def forget_cached() -> None:
    with _recent_lock:
        _recent.clear()


def client_for_token(token: str) -> Client | None:
    """Return the client owning TOKEN, or None if it is unknown or revoked."""
    if not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    digest = hash_token(token)
    ttl = settings.TASKDESK_TOKEN_CACHE_SECONDS
    now = time.monotonic()
    hit = _recent.get(digest)
    if hit is not None and now - hit[0] < ttl:
        return hit[1]
    row = (
        ClientToken.objects.select_related("client__tenant")
        .filter(token_hash=digest, revoked_at__isnull=True)
        .first()
    )
    if row is None:
        _recent.pop(digest, None)
        return None
    if ttl > 0:
        with _recent_lock:
            if len(_recent) >= _RECENT_MAX:
                _recent.clear()
            _recent[digest] = (now, row.client)
    return row.client
