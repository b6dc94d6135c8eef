"""Who calls /api/: a personal operator token, or the session of a signed-in operator.

``Authorization: Bearer tdo_…`` authenticates as the token's user; an unknown or revoked token
(or one of an inactive user) is refused with 401 and says which. Without that header, the
console's session cookie serves (the browsable API), with DRF's CSRF check on every unsafe
method. Either way the user's roles then apply exactly as on the pages.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.plumbing import build_bearer_security_scheme_object
from rest_framework import authentication, exceptions, permissions, viewsets
from rest_framework.request import Request

from tasks_app import tokens
from tasks_app.models import OperatorToken

MALFORMED = "The Authorization header must be 'Bearer <operator token>' (a token starting tdo_)."
UNKNOWN = "Unknown operator token (make one with manage.py create_operator_token)."
REVOKED = "This operator token has been revoked."
INACTIVE = "This operator token's user is inactive."


class OperatorTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer tdo_…``, a token from ``manage.py create_operator_token`` (or
    the admin). No header: not this scheme (the session may serve)."""

    def authenticate(self, request: Request) -> tuple[Any, OperatorToken] | None:
        header = request.META.get("HTTP_AUTHORIZATION")
        if not header:
            return None
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise exceptions.AuthenticationFailed(MALFORMED, code="malformed")
        row = tokens.operator_token_of(token)
        if row is None:
            raise exceptions.AuthenticationFailed(UNKNOWN, code="unknown_token")
        if row.revoked_at is not None:
            raise exceptions.AuthenticationFailed(REVOKED, code="revoked_token")
        if not row.user.is_active:
            raise exceptions.AuthenticationFailed(INACTIVE, code="inactive_user")
        tokens.mark_used(row)
        return row.user, row

    def authenticate_header(self, request: Request) -> str:
        # Named first on the views, so an unauthenticated request gets 401 with this header.
        return 'Bearer realm="taskdesk-api"'


class OperatorTokenScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    """The token in the OpenAPI schema: a bearer scheme."""

    target_class = OperatorTokenAuthentication
    name = "operatorToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return build_bearer_security_scheme_object(
            header_name="Authorization", token_prefix="Bearer", bearer_format="tdo_…"
        )


class OperatorViewSet(viewsets.ViewSet):
    """What every viewset of /api/ shares: who may call it (any signed-in operator; what they
    may see and do is their roles', decided by the code the pages use)."""

    authentication_classes = [OperatorTokenAuthentication, authentication.SessionAuthentication]
    permission_classes = [permissions.IsAuthenticated]
