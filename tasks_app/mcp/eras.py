"""Protocol eras: which wire a request speaks, and the object that answers it.

The transport (``views.McpView``) does what every era shares: HTTP method, Origin, bearer
authentication, media types, body size and JSON parsing. It then asks each registered era
whether it claims the message and hands it to the first that does. 2026-07-28 (stateless,
per-request ``_meta`` envelope) is the default: it answers anything unclaimed, including
unsupported versions with -32022. The 2025-11-25 handshake era (``tasks_app.mcp.handshake``)
claims ``initialize``, its ``MCP-Protocol-Version`` values and ``Mcp-Session-Id`` requests,
and serves the ``GET`` stream and ``DELETE`` of its sessions (``other_method``): the
stateless era has neither, so without a session those answer 405.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any

from tasks_app.mcp.errors import InvalidRequest

if TYPE_CHECKING:
    from django.http import HttpResponseBase
    from rest_framework.request import Request
    from rest_framework.views import APIView

    from tasks_app.models import Client


class ProtocolEra(abc.ABC):
    #: Protocol versions this era serves.
    versions: tuple[str, ...]

    @abc.abstractmethod
    def claims(self, request: Request, message: dict[str, Any]) -> bool:
        """Whether MESSAGE (one parsed JSON-RPC object) is for this era."""

    @abc.abstractmethod
    def handle(
        self, request: Request, view: APIView, message: dict[str, Any], client: Client
    ) -> HttpResponseBase:
        """Answer MESSAGE for CLIENT."""

    def serves_other_method(self, request: Request) -> bool:
        """Whether this GET or DELETE is this era's (asked before authentication)."""
        return False

    def other_method(self, request: Request, view: APIView, client: Client) -> HttpResponseBase:
        """Answer a GET or DELETE that ``serves_other_method`` claimed."""
        raise NotImplementedError


def request_id(message: dict[str, Any]) -> str | int:
    """The id of request MESSAGE, which JSON-RPC allows only as a string or an integer."""
    value = message["id"]
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise InvalidRequest("id must be a string or an integer")
    return value


_eras: list[ProtocolEra] = []


def register(era: ProtocolEra, *, default: bool = False) -> None:
    if default:
        _eras.append(era)
    else:
        _eras.insert(0, era)


def select(request: Request, message: dict[str, Any]) -> ProtocolEra:
    for era in _eras:
        if era.claims(request, message):
            return era
    return _eras[-1]


def for_other_method(request: Request) -> ProtocolEra | None:
    """The era that serves this GET or DELETE (None: no era does, which is a 405)."""
    for era in _eras:
        if era.serves_other_method(request):
            return era
    return None
