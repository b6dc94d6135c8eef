"""The built-in authorization server's tokens, as the MCP endpoint sees them: ``verify`` turns
an access token into an ``Access``, ``revoke_grant`` stops a grant's tokens.

Access tokens (``tda_``), refresh tokens (``tdr_``) and authorization codes carry 256 random
bits and are stored only as keyed hashes (HMAC-SHA-256 through ``salted_hmac``, as
``tasks_app.tokens`` stores the static client tokens): one indexed equality match per lookup,
nothing usable in a copy of the database. Rotating SECRET_KEY invalidates them all.

Each token is bound to the canonical URI of this server's MCP endpoint (RFC 8707), stored
with it and compared on every use, so a token issued for another resource is refused here.
"""

from __future__ import annotations

import time
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from tasks_app import tokens
from tasks_app.models import OAuthGrant, OAuthToken
from tasks_app.oauth import resource
from tasks_app.oauth.access import Access

ACCESS_PREFIX = "tda_"
REFRESH_PREFIX = "tdr_"
CODE_PREFIX = "tdc_"
_SALT = "taskdesk.oauth-token"
# The static tokens' rules: a fresh secret, kept as a keyed hash, last use written at most
# this often.
new_secret = tokens.new_token
LAST_USED_EVERY = tokens.LAST_USED_EVERY


def hash_secret(value: str) -> str:
    return tokens.hash_token(value, salt=_SALT)


# Every MCP request authenticates, so each process remembers recent positive answers for
# TASKDESK_TOKEN_CACHE_SECONDS, as tasks_app.tokens does for static tokens: a revocation
# takes effect in other processes within that time (at once in the revoking process).
# Unknown tokens are never remembered.
_recent: tokens.RecentAnswers[tuple[float, datetime, Access]] = tokens.RecentAnswers()


def forget_cached() -> None:
    _recent.forget_all()


def verify(token: str) -> Access | None:
    """The Access TOKEN grants, if it is a live access token of the built-in server for this
    MCP endpoint; None otherwise (unknown, expired, revoked, another resource, or the server
    turned off)."""
    if not settings.TASKDESK_OAUTH_SERVER:
        return None
    if not token.startswith(ACCESS_PREFIX) or len(token) > 200:
        return None
    digest = hash_secret(token)
    now = time.monotonic()
    hit = _recent.get(digest)
    fresh = hit is not None and now - hit[0] < settings.TASKDESK_TOKEN_CACHE_SECONDS
    if hit is not None and fresh and hit[1] > timezone.now():
        return hit[2]
    row = (
        OAuthToken.objects.select_related("grant__client__tenant", "grant__app", "grant__person")
        .filter(access_hash=digest, revoked_at__isnull=True, grant__revoked_at__isnull=True)
        .first()
    )
    if row is None or not _usable(row):
        _recent.pop(digest, None)
        return None
    access = _access_of(row)
    _mark_used(row.grant)
    if settings.TASKDESK_TOKEN_CACHE_SECONDS > 0:
        _recent.remember(digest, (now, row.expires_at, access))
    return access


def _usable(row: OAuthToken) -> bool:
    return (
        row.expires_at > timezone.now()
        and row.resource == resource.resource_uri()
        and not row.grant.app.disabled
    )


def _access_of(row: OAuthToken) -> Access:
    grant = row.grant
    return Access(
        client=grant.client,
        scopes=frozenset(row.scopes.split()),
        issuer=resource.builtin_issuer(),
        app=grant.app.name,
        person_id=grant.person_id,
        person_name=grant.person.get_username(),
        grant_id=grant.pk,
        expires_at=row.expires_at.timestamp(),
    )


def _mark_used(grant: OAuthGrant) -> None:
    now = timezone.now()
    if grant.last_used_at is None or now - grant.last_used_at >= LAST_USED_EVERY:
        OAuthGrant.objects.filter(pk=grant.pk).update(last_used_at=now)
        grant.last_used_at = now


def revoke_grant(grant: OAuthGrant) -> bool:
    """Revoke GRANT and every token issued on it (inside the caller's transaction); False if it
    was revoked already. This process forgets its remembered tokens at once, the others
    within TASKDESK_TOKEN_CACHE_SECONDS."""
    now = timezone.now()
    if not OAuthGrant.objects.filter(pk=grant.pk, revoked_at__isnull=True).update(revoked_at=now):
        return False
    grant.revoked_at = now
    OAuthToken.objects.filter(grant=grant, revoked_at__isnull=True).update(revoked_at=now)
    transaction.on_commit(forget_cached)
    forget_cached()
    return True


def revoke_family(family: str) -> int:
    """Revoke every token of FAMILY (one code exchange and its refreshes): a code or refresh
    token presented twice may have been stolen."""
    count = OAuthToken.objects.filter(family=family, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )
    forget_cached()
    return count
