"""Who is calling: bearer tokens as a DRF authentication class, and poll throttling.

A token is a Taskdesk client token (``tdk_``, looked up by ``tasks_app.tokens`` as before,
granting every scope) or an OAuth access token (``tasks_app.oauth.bearer``: the built-in
authorization server's, or an external issuer's JWT). Either way ``request.user`` is the
``Client`` and ``request.auth`` the ``Access`` (scopes, app, person) that later checks read.

``TASKDESK_ANONYMOUS_CLIENT`` (off by default; ``check --deploy`` warns when it is set) maps
requests without an Authorization header to that client, created on first use in a tenant of
the same name, with every scope: for local trials and conformance runs. A bad token is
refused even then.
"""

from __future__ import annotations

import logging
from typing import Any, cast

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver
from rest_framework import authentication, exceptions, permissions, throttling
from rest_framework.request import Request
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from tasks_app import tokens
from tasks_app.clients import client_get_or_create
from tasks_app.mcp.errors import is_outage
from tasks_app.models import Client
from tasks_app.oauth import access, bearer, resource
from tasks_app.oauth.access import Access

log = logging.getLogger("tasks_app.mcp")

_anonymous: dict[str, Client] = {}


@receiver(setting_changed)
def _forget_anonymous(*, setting: str, **kwargs: Any) -> None:
    if setting == "TASKDESK_ANONYMOUS_CLIENT":
        _anonymous.clear()


def anonymous_client(name: str) -> Client:
    client = _anonymous.get(name)
    if client is None:
        client = _anonymous[name] = client_get_or_create(name=name, tenant=name)
    return client


class InvalidToken(exceptions.AuthenticationFailed):
    """A bearer token was sent and is not accepted (the 401's ``error="invalid_token"``)."""

    default_detail = "The bearer token is unknown or revoked"


class BearerTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer <token>`` with a token from ``manage.py create_client_token``
    or an OAuth access token issued for this endpoint."""

    def authenticate(self, request: Request) -> tuple[Client, Access] | None:
        header = request.META.get("HTTP_AUTHORIZATION")
        if not header:
            name = settings.TASKDESK_ANONYMOUS_CLIENT
            if not name:
                return None
            client = anonymous_client(name)
            return client, access.static(client)
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise exceptions.AuthenticationFailed(
                "The Authorization header must be 'Bearer <token>'"
            )
        if token.startswith(tokens.TOKEN_PREFIX):
            owner = tokens.client_for_token(token)
            if owner is None:
                raise InvalidToken()
            return owner, access.static(owner)
        granted = bearer.verify(token)
        if granted is None:
            raise InvalidToken()
        return granted.client, granted

    def authenticate_header(self, request: Request) -> str:
        return resource.missing_token_challenge()


class HasClient(permissions.BasePermission):
    def has_permission(self, request: Request, view: APIView) -> bool:
        return isinstance(request.user, Client)


class PollThrottle(throttling.SimpleRateThrottle):
    """Slows down clients polling ``tasks/get`` faster than
    ``REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]["mcp_poll"]`` (e.g. ``"10/second"``; unset by
    default, which turns it off). Counted per client and task, in Django's cache."""

    scope = "mcp_poll"

    def __init__(self, task_id: str) -> None:
        super().__init__()
        self.task_id = task_id

    def allows(self, request: Request, view: APIView) -> bool:
        """``allow_request``, letting the poll through when the cache cannot be reached."""
        try:
            return self.allow_request(request, view)
        except Exception as exc:
            if not is_outage(exc):
                raise
            log.warning("poll rate not counted (cache unavailable): %s", exc)
            return True

    def get_rate(self) -> str | None:
        # Read at each request (DRF reads THROTTLE_RATES once at import), so the setting
        # can change without a restart of the test process.
        # The stubs type the rates as numbers; DRF's rates are strings such as "10/second".
        return cast("str | None", api_settings.DEFAULT_THROTTLE_RATES.get(self.scope))

    def get_cache_key(self, request: Request, view: APIView) -> str | None:
        client = request.user
        if not isinstance(client, Client):
            return None
        return self.cache_format % {"scope": self.scope, "ident": f"{client.pk}:{self.task_id}"}
