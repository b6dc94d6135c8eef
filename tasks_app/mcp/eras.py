"""Protocol eras: which wire a request speaks, and the object that answers it.

The transport (``views.McpView``) does what every era shares: HTTP method, Origin, bearer
authentication, media types, body size and JSON parsing. It then asks each registered era
whether it claims the message and hands it to the first that does. 2026-07-28 (stateless,
per-request ``_meta`` envelope) is the default: it answers anything unclaimed, including
unsupported versions with -32022. The 2025-11-25 handshake era plugs in here later, claiming
``initialize``, its ``MCP-Protocol-Version`` values and ``Mcp-Session-Id`` requests.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from django.http import HttpResponseBase
    from rest_framework.request import Request
    from rest_framework.views import APIView

    from tasks_app.models import Client


class ProtocolEra(abc.ABC):
    #: Protocol versions this era serves (listed in -32022 errors and server/discover).
    versions: tuple[str, ...]

    @abc.abstractmethod
    def claims(self, request: Request, message: dict[str, Any]) -> bool:
        """Whether MESSAGE (one parsed JSON-RPC object) is for this era."""

    @abc.abstractmethod
    def handle(
        self, request: Request, view: APIView, message: dict[str, Any], client: Client
    ) -> HttpResponseBase:
        """Answer MESSAGE for CLIENT."""


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


def supported_versions() -> list[str]:
    return [v for era in _eras for v in era.versions]
