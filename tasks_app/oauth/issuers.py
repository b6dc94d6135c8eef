"""Access tokens of external identity providers (``TASKDESK_OAUTH_ISSUERS``): signed JWTs.

``verify(token)`` accepts a token only when all of these hold, and answers None otherwise
(the endpoint's 401 ``invalid_token``; the reason goes to the log, never to the caller):

- it is a JWS signed with an asymmetric algorithm (``jwks.ALGORITHMS``: never ``none`` or
  ``HS*``) by a key of its issuer's key set (``tasks_app.oauth.jwks``);
- its ``iss`` is a configured issuer, exactly;
- its ``aud`` (a string or a list) names the MCP endpoint's canonical URI, compared after
  normalisation (``resource.normalized``): a token for another resource is refused;
- it has not expired (``LEEWAY_SECONDS`` of clock skew allowed) and is not used before its
  ``nbf``;
- the app it was issued to (``client_claim``; by default ``azp``, then ``client_id``) maps to
  a Taskdesk client: by the issuer's ``clients`` table, or, with ``create_clients``, a client
  of its own named ``<issuer host>:<app>`` in the tenant its ``tenant_claim`` names (created
  on first use). Anything else is an unknown subject, and refused.

The token's scopes are read from ``scope_claim`` (space-separated, or a list; ``scp`` when
the claim is absent); only Taskdesk's scopes count.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import jwt
from django.conf import settings

from tasks_app.clients import ClientTenantMismatch, client_get_or_create
from tasks_app.models import Client
from tasks_app.oauth import jwks, resource
from tasks_app.oauth.access import SCOPES, Access

if TYPE_CHECKING:
    from config.env import OAuthIssuer  # `taskdesk.env` once installed

log = logging.getLogger("tasks_app.oauth")

LEEWAY_SECONDS = 30
# A tenant named by a token becomes a Tenant.slug.
_SLUG = re.compile(r"[-a-zA-Z0-9_]{1,100}")


def verify(token: str) -> Access | None:
    """The Access TOKEN grants if an external issuer signed it for this endpoint, else None."""
    try:
        header = jwt.get_unverified_header(token)
        unverified = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError:
        return None
    issuer = _issuer(unverified.get("iss"))
    if issuer is None:
        return None
    claims = _verified(token, header, issuer)
    if claims is None:
        return None
    app = _app(issuer, claims)
    client = _client(issuer, claims, app) if app else None
    if client is None:
        _refused(issuer, "it names no Taskdesk client (app %r)", app)
        return None
    return Access(
        client=client,
        scopes=_scopes(issuer, claims),
        issuer=issuer.issuer,
        app=app,
        expires_at=float(claims["exp"]),
    )


def _issuer(iss: Any) -> OAuthIssuer | None:
    if not isinstance(iss, str):
        return None
    return next((i for i in settings.TASKDESK_OAUTH_ISSUERS if i.issuer == iss), None)


def _refused(issuer: OAuthIssuer, reason: str, *args: Any) -> None:
    log.info("refused a token of issuer %s: " + reason, issuer.issuer, *args)


def _verified(token: str, header: dict[str, Any], issuer: OAuthIssuer) -> dict[str, Any] | None:
    """The claims of TOKEN once its signature, issuer, audience and times are checked."""
    alg, kid = header.get("alg"), header.get("kid")
    if alg not in jwks.ALGORITHMS or not (kid is None or isinstance(kid, str)):
        _refused(issuer, "algorithm %r is not accepted", alg)
        return None
    key = jwks.signing_key(issuer, kid, alg)
    if key is None:
        _refused(issuer, "no signing key %r for %s", kid, alg)
        return None
    try:
        claims: dict[str, Any] = jwt.decode(
            token,
            key,
            algorithms=[alg],
            issuer=issuer.issuer,
            leeway=LEEWAY_SECONDS,
            # The audience is compared here after normalisation (RFC 8707), not by PyJWT.
            options={"require": ["exp", "iss", "aud"], "verify_aud": False},
        )
    except jwt.PyJWTError as exc:
        _refused(issuer, "%s", exc)
        return None
    if resource.resource_uri() not in _audiences(claims["aud"]):
        _refused(issuer, "it is for another resource (aud %r)", claims["aud"])
        return None
    return claims


def _audiences(aud: Any) -> set[str]:
    values = aud if isinstance(aud, list) else [aud]
    return {resource.normalized(value) for value in values if isinstance(value, str)}


def _app(issuer: OAuthIssuer, claims: dict[str, Any]) -> str:
    names = (issuer.client_claim,) if issuer.client_claim else ("azp", "client_id")
    for name in names:
        value = claims.get(name)
        if isinstance(value, str) and value:
            return value
    return ""


def _scopes(issuer: OAuthIssuer, claims: dict[str, Any]) -> frozenset[str]:
    value = claims.get(issuer.scope_claim)
    if value is None:
        value = claims.get("scp")
    names = value.split() if isinstance(value, str) else value if isinstance(value, list) else []
    return frozenset(name for name in names if name in SCOPES)


def client_name(issuer: OAuthIssuer, app: str) -> str:
    """The name of the client ``create_clients`` makes for APP."""
    return f"{urlsplit(issuer.issuer).hostname}:{app}"


def _client(issuer: OAuthIssuer, claims: dict[str, Any], app: str) -> Client | None:
    mapped = issuer.clients.get(app)
    if mapped is not None:
        client = Client.objects.select_related("tenant").filter(name=mapped).first()
        if client is None:
            log.warning("issuer %s maps %r to client %r, which does not exist",
                        issuer.issuer, app, mapped)  # fmt: skip
        return client
    if not issuer.create_clients:
        return None
    tenant = claims.get(issuer.tenant_claim)
    name = client_name(issuer, app)
    if not isinstance(tenant, str) or not _SLUG.fullmatch(tenant) or len(name) > 100:
        _refused(issuer, "no usable tenant claim %r for app %r", tenant, app)
        return None
    try:
        return client_get_or_create(name=name, tenant=tenant)
    except ClientTenantMismatch as exc:
        _refused(issuer, "%s", exc)
        return None
