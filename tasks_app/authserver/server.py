"""The authorization server itself: Authlib's OAuth 2.1 machinery over Taskdesk's records.

Authlib validates the requests and shapes the responses (RFC 6749 errors, the code and
refresh grants, PKCE, client authentication, RFC 7009 revocation); the classes here say
where things are stored and add what MCP requires on top:

- PKCE with ``S256`` only: a request without a challenge, or with ``plain``, is refused.
- The ``resource`` parameter (RFC 8707) at the authorization request and the code exchange,
  equal to this server's MCP endpoint (``resource.resource_uri``), stored with the code and
  the token; a refresh may repeat it and never changes it.
- Single-use codes and rotating refresh tokens, both claimed by compare-and-set: a code or a
  refresh token presented again revokes every token of its exchange (its ``family``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from authlib.integrations.django_oauth2.requests import (
    DjangoJsonRequest,
    DjangoOAuth2Payload,
    DjangoOAuth2Request,
)
from authlib.oauth2 import AuthorizationServer
from authlib.oauth2.rfc6749 import (
    ClientMixin,
    InvalidGrantError,
    InvalidRequestError,
    OAuth2Error,
    OAuth2Request,
    grants,
    scope_to_list,
)
from authlib.oauth2.rfc7009 import RevocationEndpoint
from authlib.oauth2.rfc7636 import CodeChallenge
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.utils.crypto import constant_time_compare

from tasks_app.authserver.metadata import AUTH_METHODS
from tasks_app.authserver.registration import Registration
from tasks_app.models import OAuthApp, OAuthCode, OAuthGrant, OAuthToken
from tasks_app.oauth import builtin, resource
from tasks_app.oauth.access import SCOPES

CODE_LIFETIME = timedelta(minutes=5)
GRANT_TYPES = ["authorization_code", "refresh_token"]


class InvalidTargetError(OAuth2Error):  # type: ignore[misc]  # Authlib is untyped
    """RFC 8707 §2: the resource is not one this server issues tokens for."""

    error = "invalid_target"


# --- what Authlib reads: the app, the code and the token ----------------------------------


class App(ClientMixin):  # type: ignore[misc]
    """An ``OAuthApp`` as Authlib asks about it."""

    def __init__(self, row: OAuthApp) -> None:
        self.row = row

    def get_client_id(self) -> str:
        return self.row.client_id

    def get_default_redirect_uri(self) -> str | None:
        uris = self.row.redirect_uris
        return uris[0] if len(uris) == 1 else None

    def get_allowed_scope(self, scope: str | None) -> str:
        # No scope asked: every scope (the consent page shows them).
        return " ".join(scope_to_list(scope) or SCOPES)

    def check_redirect_uri(self, redirect_uri: str) -> bool:
        return redirect_uri in self.row.redirect_uris

    def check_client_secret(self, client_secret: str) -> bool:
        stored = self.row.client_secret_hash
        return bool(stored) and constant_time_compare(builtin.hash_secret(client_secret), stored)

    def check_endpoint_auth_method(self, method: str, endpoint: str) -> bool:
        return method == self.row.token_endpoint_auth_method

    def check_response_type(self, response_type: str) -> bool:
        return response_type == "code"

    def check_grant_type(self, grant_type: str) -> bool:
        return grant_type in GRANT_TYPES


@dataclass
class Code:
    row: OAuthCode

    @property
    def code_challenge(self) -> str:
        return self.row.code_challenge

    @property
    def code_challenge_method(self) -> str:
        return self.row.code_challenge_method

    def get_redirect_uri(self) -> str:
        return self.row.redirect_uri

    def get_scope(self) -> str:
        return self.row.scopes


@dataclass
class Token:
    row: OAuthToken

    def check_client(self, client: App) -> bool:
        return bool(self.row.grant.app_id == client.row.pk)

    def get_scope(self) -> str:
        return self.row.scopes


@dataclass(frozen=True)
class Approval:
    """The person's decision on the consent page, as Authlib's "grant user"."""

    grant: OAuthGrant


# --- the grants --------------------------------------------------------------------------


def _resource(request: Any, *, required: bool) -> str | None:
    """The request's one ``resource``, canonical, if it is this server's MCP endpoint."""
    values = request.payload.datalist.get("resource", [])
    if not values:
        if required:
            raise InvalidTargetError(
                f"The resource parameter is required: the MCP endpoint {resource.resource_uri()}"
            )
        return None
    if len(values) > 1 or resource.normalized(values[0]) != resource.resource_uri():
        raise InvalidTargetError(
            f"This server issues tokens only for the resource {resource.resource_uri()}"
        )
    return resource.resource_uri()


class S256Challenge(CodeChallenge):  # type: ignore[misc]
    """PKCE, required, with S256 only (OAuth 2.1; the MCP authorization specification)."""

    SUPPORTED_CODE_CHALLENGE_METHOD = ["S256"]
    DEFAULT_CODE_CHALLENGE_METHOD = "S256"

    def validate_code_challenge(self, grant: Any, redirect_uri: str) -> None:
        data = grant.request.payload.data
        if not data.get("code_challenge"):
            raise InvalidRequestError("PKCE is required: send code_challenge (S256).")
        if data.get("code_challenge_method") != "S256":
            raise InvalidRequestError(
                "code_challenge_method must be S256 (plain is not supported)."
            )
        super().validate_code_challenge(grant, redirect_uri)


class ResourceIndicator:
    """The authorization request's ``resource`` (RFC 8707), required, kept for its code."""

    def __call__(self, grant: Any) -> None:
        grant.register_hook("after_validate_authorization_request_payload", self.validate)

    def validate(self, grant: Any, redirect_uri: str) -> None:
        grant.request.resource = _resource(grant.request, required=True)


class CodeGrant(grants.AuthorizationCodeGrant):  # type: ignore[misc]
    TOKEN_ENDPOINT_AUTH_METHODS = AUTH_METHODS

    def generate_authorization_code(self) -> str:
        return builtin.new_secret(builtin.CODE_PREFIX)

    def save_authorization_code(self, code: str, request: Any) -> None:
        approval: Approval = request.user
        OAuthCode.objects.create(
            code_hash=builtin.hash_secret(code),
            grant=approval.grant,
            redirect_uri=request.payload.redirect_uri or request.client.get_default_redirect_uri(),
            scopes=request.scope,
            resource=request.resource,
            code_challenge=request.payload.data["code_challenge"],
            code_challenge_method="S256",
            expires_at=timezone.now() + CODE_LIFETIME,
        )

    def query_authorization_code(self, code: str, client: App) -> Code | None:
        row = (
            OAuthCode.objects.select_related("grant")
            .filter(code_hash=builtin.hash_secret(code), grant__app=client.row)
            .first()
        )
        if row is None:
            return None
        if row.used_at is not None:
            builtin.revoke_family(_family_of(row))
            return None
        if row.expires_at <= timezone.now() or row.grant.revoked_at is not None:
            return None
        return Code(row)

    def validate_token_request(self) -> None:
        super().validate_token_request()
        code: Code = self.request.authorization_code
        if _resource(self.request, required=True) != code.row.resource:
            raise InvalidTargetError("The resource is not the one the code was issued for.")
        self.request.resource = code.row.resource
        self.request.family = _family_of(code.row)

    def create_token_response(self) -> Any:
        code: Code = self.request.authorization_code
        claimed = OAuthCode.objects.filter(pk=code.row.pk, used_at__isnull=True)
        if not claimed.update(used_at=timezone.now()):
            raise InvalidGrantError("The code was used already.")
        return super().create_token_response()

    def delete_authorization_code(self, authorization_code: Code) -> None:
        pass  # kept, marked used: a second exchange finds it and revokes what the first got

    def authenticate_user(self, authorization_code: Code) -> OAuthGrant:
        return authorization_code.row.grant


def _family_of(code: OAuthCode) -> str:
    return f"c{code.pk}"


class RefreshGrant(grants.RefreshTokenGrant):  # type: ignore[misc]
    TOKEN_ENDPOINT_AUTH_METHODS = AUTH_METHODS
    INCLUDE_NEW_REFRESH_TOKEN = True  # rotation: each refresh token is used once

    def authenticate_refresh_token(self, refresh_token: str) -> Token | None:
        if not refresh_token.startswith(builtin.REFRESH_PREFIX) or len(refresh_token) > 200:
            return None
        rows = OAuthToken.objects.select_related("grant__app")
        row = rows.filter(refresh_hash=builtin.hash_secret(refresh_token)).first()
        if row is None:
            return None
        if row.refreshed_at is not None:
            builtin.revoke_family(row.family)  # a spent refresh token again: stolen, maybe
            return None
        expired = row.refresh_expires_at is not None and row.refresh_expires_at <= timezone.now()
        if row.revoked_at is not None or row.grant.revoked_at is not None or expired:
            return None
        return Token(row)

    def validate_token_request(self) -> None:
        super().validate_token_request()
        token: Token = self.request.refresh_token
        resource = _resource(self.request, required=False)
        if resource is not None and resource != token.row.resource:
            raise InvalidTargetError("The resource is not the one the token was issued for.")
        self.request.resource = token.row.resource
        self.request.family = token.row.family

    def create_token_response(self) -> Any:
        token: Token = self.request.refresh_token
        claimed = OAuthToken.objects.filter(
            pk=token.row.pk, refreshed_at__isnull=True, revoked_at__isnull=True
        )
        if not claimed.update(refreshed_at=timezone.now()):
            raise InvalidGrantError("The refresh token was used already.")
        return super().create_token_response()

    def authenticate_user(self, refresh_token: Token) -> OAuthGrant:
        return refresh_token.row.grant

    def revoke_old_credential(self, refresh_token: Token) -> None:
        pass  # marked refreshed by the claim in create_token_response


class Revocation(RevocationEndpoint):  # type: ignore[misc]
    """RFC 7009: an access token revokes itself and the refresh token issued with it; a
    refresh token revokes every token of its exchange."""

    CLIENT_AUTH_METHODS = AUTH_METHODS

    def query_token(self, token_string: str, token_type_hint: str | None) -> Token | None:
        digest = builtin.hash_secret(token_string)
        rows = OAuthToken.objects.select_related("grant")
        row = rows.filter(access_hash=digest).first() or rows.filter(refresh_hash=digest).first()
        return Token(row) if row is not None else None

    def revoke_token(self, token: Token, request: Any) -> None:
        if token.row.refresh_hash == builtin.hash_secret(request.form["token"]):
            builtin.revoke_family(token.row.family)
        else:
            OAuthToken.objects.filter(pk=token.row.pk).update(revoked_at=timezone.now())
            builtin.forget_cached()


# --- the server ------------------------------------------------------------------------------


class PublishedRequest(DjangoOAuth2Request):  # type: ignore[misc]
    """A request as addressed to the server's published URL (TASKDESK_PUBLIC_URL): Authlib
    refuses requests it sees over plain http to anything but a loopback host (OAuth 2.1 §1.5),
    and behind the TLS proxy it is the public URL the client used."""

    def __init__(self, request: HttpRequest) -> None:
        OAuth2Request.__init__(
            self,
            method=request.method,
            uri=resource.builtin_issuer() + request.get_full_path(),
            headers=request.headers,
        )
        self.payload = DjangoOAuth2Payload(request)
        self._request = request


class Server(AuthorizationServer):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__(scopes_supported=list(SCOPES))
        self.register_token_generator("default", _generate_token)
        self.register_grant(CodeGrant, [S256Challenge(required=True), ResourceIndicator()])
        self.register_grant(RefreshGrant)
        self.register_endpoint(Revocation)
        self.register_endpoint(Registration())

    def query_client(self, client_id: str) -> App | None:
        row = OAuthApp.objects.filter(client_id=client_id, disabled=False).first()
        return App(row) if row is not None else None

    def save_token(self, token: dict[str, Any], request: Any) -> None:
        grant: OAuthGrant = request.user
        now = timezone.now()
        refresh = token.get("refresh_token")
        OAuthToken.objects.create(
            access_hash=builtin.hash_secret(token["access_token"]),
            refresh_hash=builtin.hash_secret(refresh) if refresh else None,
            grant=grant,
            family=request.family,
            scopes=token.get("scope", ""),
            resource=request.resource,
            expires_at=now + timedelta(seconds=token["expires_in"]),
            refresh_expires_at=(
                now + timedelta(days=settings.TASKDESK_OAUTH_REFRESH_TOKEN_DAYS)
                if refresh
                else None
            ),
        )

    def create_oauth2_request(self, request: HttpRequest) -> Any:
        return PublishedRequest(request)

    def create_json_request(self, request: HttpRequest) -> Any:
        return DjangoJsonRequest(request)

    def handle_response(self, status: int, body: Any, headers: Any) -> HttpResponse:
        content = json.dumps(body) if isinstance(body, dict) else body
        response = HttpResponse(content, status=status)
        for name, value in headers:
            response[name] = value
        return response

    def send_signal(self, name: str, *args: Any, **kwargs: Any) -> None:
        pass  # nothing listens


def _generate_token(
    grant_type: str,
    client: App,
    user: Any = None,
    scope: str | None = None,
    expires_in: int | None = None,
    include_refresh_token: bool = True,
) -> dict[str, Any]:
    token: dict[str, Any] = {
        "token_type": "Bearer",
        "access_token": builtin.new_secret(builtin.ACCESS_PREFIX),
        "expires_in": expires_in or settings.TASKDESK_OAUTH_ACCESS_TOKEN_SECONDS,
    }
    if scope:
        token["scope"] = scope
    if include_refresh_token:
        token["refresh_token"] = builtin.new_secret(builtin.REFRESH_PREFIX)
    return token


_server: Server | None = None


def server() -> Server:
    """The one authorization server of the process (it holds no request state)."""
    global _server
    if _server is None:
        _server = Server()
    return _server
