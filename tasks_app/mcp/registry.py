"""Method registries: which JSON-RPC methods an era serves, and how their params look.

A protocol era owns one ``MethodRegistry``. A method is a plain function taking a ``Call``;
it returns the result object (a dict; ``resultType`` defaults to ``"complete"``) or a
``Streamed`` when the answer may carry notifications first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from tasks_app.mcp.headers import sent
from tasks_app.mcp.params import Params, validate
from tasks_app.models import Era

if TYPE_CHECKING:
    from rest_framework.request import Request
    from rest_framework.views import APIView

    from tasks_app.mcp.envelope import Envelope
    from tasks_app.models import Client, McpSession
    from tasks_app.oauth.access import Access

Handler = Callable[["Call"], Any]


@dataclass
class Call:
    """One JSON-RPC request, authenticated and with its envelope checked."""

    id: str | int
    method: str
    params: dict[str, Any]
    envelope: Envelope
    client: Client
    request: Request
    view: APIView
    data: dict[str, Any] = field(default_factory=dict)
    # The wire family: "2026-07-28" (stateless) or "2025-11-25" (handshake; ``session`` set).
    era: str = Era.MODERN.value
    session: McpSession | None = None

    def header(self, name: str) -> str | None:
        return sent(self.request, name)

    @property
    def access(self) -> Access:
        """What the request's token grants (``tasks_app.mcp.auth`` sets it on every request)."""
        return cast("Access", self.request.auth)


@dataclass(frozen=True)
class Method:
    name: str
    handler: Handler
    params: type[Params] | None
    # The params key that the Mcp-Name header mirrors (SEP-2243; SEP-2663 for tasks/*).
    name_param: str | None
    # Whether a request without that header is refused. The core requires it on tools/call,
    # prompts/get and resources/read and lists a missing one as a header validation failure
    # (streamable-http.mdx, "Server Validation"); the tasks extension only tells clients to
    # set it on tasks/* for routing ("Streamable HTTP: Routing Headers"), so there a missing
    # one is served from the body unless TASKDESK_STRICT_ROUTING_HEADERS is on.
    name_required: bool = True

    def validate(self, params: dict[str, Any]) -> dict[str, Any]:
        if self.params is None:
            return params
        return validate(self.params, params)


class MethodRegistry:
    def __init__(self) -> None:
        self._methods: dict[str, Method] = {}

    def method(
        self,
        name: str,
        *,
        params: type[Params] | None = None,
        name_param: str | None = None,
        name_required: bool = True,
    ) -> Callable[[Handler], Handler]:
        def register(handler: Handler) -> Handler:
            if name in self._methods:
                raise ValueError(f"method {name} is registered twice")
            self._methods[name] = Method(name, handler, params, name_param, name_required)
            return handler

        return register

    def share(self, other: MethodRegistry, *names: str) -> None:
        """Serve NAMES with OTHER's methods (the same function and params on both wires)."""
        for name in names:
            method = other._methods[name]
            if name in self._methods:
                raise ValueError(f"method {name} is registered twice")
            self._methods[name] = method

    def get(self, name: str) -> Method | None:
        return self._methods.get(name)

    def __contains__(self, name: str) -> bool:
        return name in self._methods

    def names(self) -> frozenset[str]:
        return frozenset(self._methods)
