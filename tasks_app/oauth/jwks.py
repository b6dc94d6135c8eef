"""The signing keys of the external issuers: each issuer's JWK set, fetched over HTTP and kept
per process.

The set's address is the issuer's ``jwks_uri`` setting, or the one its metadata names
(``<issuer>/.well-known/openid-configuration``, then RFC 8414's
``/.well-known/oauth-authorization-server``), taken only from a document whose ``issuer`` is
the configured one. A set is used for ``KEYS_LIFETIME`` seconds; a token naming a key id the
set lacks (the issuer rotated its keys) fetches it again, but at most once every
``TASKDESK_OAUTH_JWKS_REFETCH_SECONDS`` per issuer, so tokens with made-up key ids cannot make
the server fetch on every request. When a fetch fails, the keys fetched before stay in use.

Fetches have a short timeout, follow no redirect and read at most ``MAX_DOCUMENT_BYTES``.
Only signing keys of asymmetric algorithms are kept (``use`` absent or ``sig``; never ``oct``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import jwt
import urllib3
from django.conf import settings

if TYPE_CHECKING:
    from config.env import OAuthIssuer  # `taskdesk.env` once installed


log = logging.getLogger("tasks_app.oauth")

KEYS_LIFETIME = 300.0
MAX_DOCUMENT_BYTES = 512 * 1024
TIMEOUT = urllib3.Timeout(connect=3.0, read=5.0)
# The algorithms each key type may verify; symmetric (HS*) and "none" are never accepted.
FAMILIES = {
    "RSA": ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512"),
    "EC": ("ES256", "ES384", "ES512"),
    "OKP": ("EdDSA",),
}
ALGORITHMS = frozenset(alg for algs in FAMILIES.values() for alg in algs)


@dataclass
class _KeySet:
    keys: dict[str, dict[str, Any]] = field(default_factory=dict)  # kid ("" if none) -> JWK
    fetched_at: float = float("-inf")  # monotonic, of the last fetch that succeeded
    tried_at: float = float("-inf")  # monotonic, of the last attempt
    prepared: dict[tuple[str, str], jwt.PyJWK] = field(default_factory=dict)


_sets: dict[str, _KeySet] = {}
_lock = threading.Lock()
_http = urllib3.PoolManager(timeout=TIMEOUT, retries=False)


def forget() -> None:
    """Forget every fetched key set (tests; a changed TASKDESK_OAUTH_ISSUERS)."""
    with _lock:
        _sets.clear()


def signing_key(issuer: OAuthIssuer, kid: str | None, alg: str) -> jwt.PyJWK | None:
    """ISSUER's key KID (None: the set's only key) for verifying ALG, or None if it has none."""
    keys = _sets.get(issuer.issuer)
    if keys is None or _stale(keys) or _find(keys, kid) is None:
        with _lock:
            keys = _sets.setdefault(issuer.issuer, _KeySet())
            if (_stale(keys) or _find(keys, kid) is None) and _may_fetch(keys):
                _refresh(issuer, keys)
    jwk = _find(keys, kid)
    return None if jwk is None else _prepared(keys, jwk, alg)


def _stale(keys: _KeySet) -> bool:
    return time.monotonic() - keys.fetched_at > KEYS_LIFETIME


def _may_fetch(keys: _KeySet) -> bool:
    return time.monotonic() - keys.tried_at >= settings.TASKDESK_OAUTH_JWKS_REFETCH_SECONDS


def _find(keys: _KeySet, kid: str | None) -> dict[str, Any] | None:
    if kid is not None:
        return keys.keys.get(kid)
    return next(iter(keys.keys.values())) if len(keys.keys) == 1 else None


def _prepared(keys: _KeySet, jwk: dict[str, Any], alg: str) -> jwt.PyJWK | None:
    if alg not in FAMILIES.get(jwk.get("kty", ""), ()) or jwk.get("alg", alg) != alg:
        return None
    slot = (str(jwk.get("kid", "")), alg)
    key = keys.prepared.get(slot)
    if key is None:
        try:
            key = jwt.PyJWK(jwk, algorithm=alg)
        except jwt.PyJWTError as exc:
            log.warning("a signing key of the issuer cannot be used: %s", exc)
            return None
        keys.prepared[slot] = key
    return key


def _refresh(issuer: OAuthIssuer, keys: _KeySet) -> None:
    keys.tried_at = time.monotonic()
    uri = issuer.jwks_uri or _discovered_jwks_uri(issuer.issuer)
    document = _fetch_json(uri) if uri else None
    found = document.get("keys") if document is not None else None
    if not isinstance(found, list):
        log.warning("the signing keys of issuer %s could not be fetched", issuer.issuer)
        return
    keys.keys = {
        str(jwk.get("kid", "")): jwk
        for jwk in found
        if isinstance(jwk, dict) and jwk.get("kty") in FAMILIES and jwk.get("use", "sig") == "sig"
    }
    keys.prepared = {}
    keys.fetched_at = keys.tried_at
    log.info("fetched %d signing keys of issuer %s", len(keys.keys), issuer.issuer)


def metadata_urls(issuer: str) -> list[str]:
    """Where ISSUER's metadata may be: OpenID Connect Discovery, then RFC 8414."""
    parts = urlsplit(issuer)
    rfc8414 = "/.well-known/oauth-authorization-server" + parts.path.rstrip("/")
    return [
        issuer.rstrip("/") + "/.well-known/openid-configuration",
        urlunsplit((parts.scheme, parts.netloc, rfc8414, "", "")),
    ]


def _discovered_jwks_uri(issuer: str) -> str | None:
    for url in metadata_urls(issuer):
        document = _fetch_json(url)
        if document is None:
            continue
        uri = document.get("jwks_uri")
        if document.get("issuer") == issuer and isinstance(uri, str) and uri:
            return uri
        log.warning("the metadata at %s is not issuer %s's", url, issuer)
    return None


def _fetch_json(url: str) -> dict[str, Any] | None:
    """The JSON object at URL, or None when it cannot be had (logged)."""
    if urlsplit(url).scheme not in ("http", "https"):
        log.warning("not fetching %s: not an http(s) URL", url)
        return None
    try:
        response = _http.request(
            "GET", url, headers={"Accept": "application/json"}, preload_content=False
        )
        try:
            body = response.read(MAX_DOCUMENT_BYTES + 1)
        finally:
            response.release_conn()
    except urllib3.exceptions.HTTPError as exc:
        log.warning("fetching %s failed: %s", url, exc)
        return None
    if response.status != 200 or len(body) > MAX_DOCUMENT_BYTES:
        log.warning("fetching %s answered %s (%d bytes)", url, response.status, len(body))
        return None
    try:
        document = json.loads(body)
    except ValueError:
        log.warning("%s is not JSON", url)
        return None
    return document if isinstance(document, dict) else None
