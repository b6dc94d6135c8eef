"""Bearer tokens, of MCP clients (``tdk_``) and of operators for /api/ (``tdo_``): generated
from the OS CSPRNG, stored only as a keyed hash.

A token carries 256 random bits, so a fast keyed hash (HMAC-SHA-256 through Django's
``salted_hmac``) is the right tool: nothing to brute-force, and lookups stay one indexed
equality match. Rotating SECRET_KEY invalidates every token.
"""

from __future__ import annotations

import secrets
import threading
import time
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.conf import settings
from django.utils import timezone
from django.utils.crypto import salted_hmac

from tasks_app.models import Client, ClientToken, OperatorToken

TOKEN_PREFIX = "tdk_"
OPERATOR_TOKEN_PREFIX = "tdo_"
# How stale an operator token's last_used_at may get: a request writes it at most this often.
LAST_USED_EVERY = timedelta(minutes=1)
_SALT = "taskdesk.client-token"
# How many answers a process remembers before it starts again from none.
RECENT_MAX = 10_000

V = TypeVar("V")


def hash_token(token: str, *, salt: str = _SALT) -> str:
    """TOKEN's keyed hash, the only form in which it is kept (SALT: one per kind of secret)."""
    return salted_hmac(salt, token, algorithm="sha256").hexdigest()


def new_token(prefix: str) -> str:
    """A new secret: PREFIX and 256 random bits."""
    return prefix + secrets.token_urlsafe(32)


def issue(client: Client) -> str:
    """Create a new token for CLIENT and return it; only its hash is kept."""
    row = ClientToken(client=client)
    token = fill(row)
    row.save()
    return token


def fill(row: ClientToken | OperatorToken, *, prefix: str = TOKEN_PREFIX) -> str:
    """Give ROW (not saved yet) a new token's hash and prefix, and return the token."""
    token = new_token(prefix)
    row.token_hash = hash_token(token)
    row.prefix = token[: len(prefix) + 6]
    return token


def revoke_all(client: Client) -> int:
    count = ClientToken.objects.filter(client=client, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )
    forget_cached()
    return count


class RecentAnswers(dict[str, V]):
    """A process's recent positive answers to token lookups, by the token's digest, each with
    what tells its reader whether it is still fresh. Read as a dict, without a lock; written
    under one. Full at RECENT_MAX, it forgets every answer at once: a bound on the memory that
    costs no bookkeeping of ages, and the next lookups only ask the database again."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()

    def remember(self, digest: str, entry: V) -> None:
        with self._lock:
            if len(self) >= RECENT_MAX:
                self.clear()
            self[digest] = entry

    def forget_all(self) -> None:
        with self._lock:
            self.clear()


# Every MCP request authenticates, and the lookup was the largest part of a request's cost,
# so each process remembers recent positive answers for TASKDESK_TOKEN_CACHE_SECONDS. A
# revocation therefore takes effect in other processes within that many seconds (at once in
# the revoking process). Unknown tokens are never cached, so a new token works at once.
_recent: RecentAnswers[tuple[float, Client]] = RecentAnswers()


def forget_cached() -> None:
    _recent.forget_all()


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
        _recent.remember(digest, (now, row.client))
    return row.client


# --- operator tokens --------------------------------------------------------------------------
# Looked up on every request to /api/ and never remembered, so a revocation holds at once (the
# API's traffic is an operator's, not every MCP call's).


class TokenNameTaken(ValueError):
    """The user already has a live token of that name."""


def issue_operator_token(user: Any, name: str) -> tuple[OperatorToken, str]:
    """Create a new operator token NAME of USER and return it with the token; only its hash is
    kept. Raise TokenNameTaken if USER has a live token of that name."""
    if OperatorToken.objects.filter(user=user, name=name, revoked_at__isnull=True).exists():
        raise TokenNameTaken(f"{user.get_username()} already has a token named {name!r}")
    row = OperatorToken(user=user, name=name)
    token = fill(row, prefix=OPERATOR_TOKEN_PREFIX)
    row.save()
    return row, token


def operator_token_of(token: str) -> OperatorToken | None:
    """The operator token TOKEN is, revoked or not, with its user; None for anything else."""
    if not token.startswith(OPERATOR_TOKEN_PREFIX) or len(token) > 200:
        return None
    rows = OperatorToken.objects.select_related("user")
    return rows.filter(token_hash=hash_token(token)).first()


def mark_used(row: OperatorToken, *, now: datetime | None = None) -> None:
    """Note that ROW was used now, if its last use is older than LAST_USED_EVERY."""
    now = now or timezone.now()
    if row.last_used_at is None or now - row.last_used_at >= LAST_USED_EVERY:
        OperatorToken.objects.filter(pk=row.pk).update(last_used_at=now)
        row.last_used_at = now


def revoke_operator_tokens(user: Any, *, name: str | None = None) -> list[OperatorToken]:
    """Revoke USER's live operator tokens (only the one named NAME, when given); return them."""
    live = OperatorToken.objects.filter(user=user, revoked_at__isnull=True)
    if name is not None:
        live = live.filter(name=name)
    rows = list(live.select_for_update().order_by("pk"))
    now = timezone.now()
    OperatorToken.objects.filter(pk__in=[row.pk for row in rows]).update(revoked_at=now)
    for row in rows:
        row.revoked_at = now
    return rows
