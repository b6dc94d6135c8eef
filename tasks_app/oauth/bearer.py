"""``verify(token)``: the ``Access`` an OAuth access token grants the MCP endpoint, or None.

The one entry point of the endpoint's authentication for tokens that are not Taskdesk's static
client tokens (``tdk_``, ``tasks_app.tokens``): it asks the built-in authorization server
(``tasks_app.oauth.builtin``), then the external issuers (``tasks_app.oauth.issuers``). None
means neither accepts the token; the endpoint answers 401 ``invalid_token``.

Checking an external issuer's token means parsing a JWT and verifying its signature, so each
process remembers a verified token for ``TASKDESK_TOKEN_CACHE_SECONDS`` (never past its
``exp``), keyed by a hash of the token, as ``tasks_app.tokens`` does for static tokens: a
``tasks/get`` with such a token then costs what it costs with a static one. The built-in
server remembers its own tokens (and forgets them when a grant is revoked). Refusals are
never remembered.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from tasks_app import tokens
from tasks_app.oauth import builtin, issuers, jwks
from tasks_app.oauth.access import Access

# Longer than any access token issued in practice (a JWT of a few kilobytes): anything longer
# is refused before it is parsed.
MAX_TOKEN_CHARS = 16 * 1024

# digest -> (trusted until, monotonic), access
_recent: tokens.RecentAnswers[tuple[float, Access]] = tokens.RecentAnswers()


def forget_cached() -> None:
    _recent.forget_all()


@receiver(setting_changed)
def _forget_issuers(*, setting: str, **kwargs: Any) -> None:
    if setting == "TASKDESK_OAUTH_ISSUERS":
        forget_cached()
        jwks.forget()


def verify(token: str) -> Access | None:
    if not token or len(token) > MAX_TOKEN_CHARS:
        return None
    return builtin.verify(token) or _external(token)


def _external(token: str) -> Access | None:
    if not settings.TASKDESK_OAUTH_ISSUERS:
        return None
    digest = hashlib.sha256(token.encode()).hexdigest()
    now = time.monotonic()
    hit = _recent.get(digest)
    if hit is not None and now < hit[0]:
        return hit[1]
    access = issuers.verify(token)
    if access is None:
        _recent.pop(digest, None)
        return None
    ttl = settings.TASKDESK_TOKEN_CACHE_SECONDS
    if access.expires_at is not None:
        ttl = min(ttl, access.expires_at - time.time())
    if ttl > 0:
        _recent.remember(digest, (now + ttl, access))
    return access
