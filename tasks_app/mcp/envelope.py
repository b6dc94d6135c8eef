"""The per-request ``_meta`` envelope of the 2026-07-28 wire.

Every request carries its protocol version and the client's capabilities in
``params._meta`` (SEP-2575, "Stateless MCP"); the server decides each request from that
request's own declarations and never remembers earlier ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tasks_app.mcp.errors import InvalidParams
from tasks_app.models import TASKS_EXTENSION

PROTOCOL_VERSION = "io.modelcontextprotocol/protocolVersion"
CLIENT_INFO = "io.modelcontextprotocol/clientInfo"
CLIENT_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
LOG_LEVEL = "io.modelcontextprotocol/logLevel"
SERVER_INFO = "io.modelcontextprotocol/serverInfo"

# RFC 5424 severities, lowest first (the MCP LoggingLevel enum).
LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
_LEVEL_RANK = {name: rank for rank, name in enumerate(LOG_LEVELS)}

MISSING_ENVELOPE = (
    "params._meta must be an object carrying the required "
    f"'{PROTOCOL_VERSION}' and '{CLIENT_CAPABILITIES}' envelope keys"
)


@dataclass(frozen=True)
class Envelope:
    protocol_version: str
    capabilities: dict[str, Any]
    client_info: dict[str, Any] | None = None
    log_level: str | None = None
    progress_token: str | int | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    # The capabilities are a 2025-11-25 session's, declared once in its ``initialize``
    # (``tasks_app.mcp.handshake.session_envelope``), not this request's own.
    from_session: bool = False

    @property
    def declares_tasks(self) -> bool:
        """Whether this request may be answered with a 2026 task (``CreateTaskResult``,
        ``resultType: "task"``): its own ``_meta`` declares the tasks extension. Never on the
        handshake wire: an ``initialize`` that lists the extension (the MCP Inspector's does)
        is a prior declaration, which SEP-2663 says does not count ("regardless of prior
        declarations"), and a 2025-11-25 client asks for its kind of task with
        ``params.task`` on the call itself."""
        if self.from_session:
            return False
        extensions = self.capabilities.get("extensions")
        return isinstance(extensions, dict) and isinstance(extensions.get(TASKS_EXTENSION), dict)

    def declares(self, method: str, mode: str | None = None) -> bool:
        """Whether the client can answer an input request of METHOD (and elicitation MODE)."""
        if method == "elicitation/create":
            elicitation = self.capabilities.get("elicitation")
            if not isinstance(elicitation, dict):
                return False
            # An empty elicitation capability means form mode only.
            if not elicitation:
                return mode in (None, "form")
            return isinstance(elicitation.get(mode or "form"), dict)
        if method == "sampling/createMessage":
            return isinstance(self.capabilities.get("sampling"), dict)
        if method == "roots/list":
            return isinstance(self.capabilities.get("roots"), dict)
        return False

    def logs(self, level: str) -> bool:
        """Whether a log line at LEVEL goes to the client (no logLevel: nothing does)."""
        if self.log_level is None:
            return False
        return _LEVEL_RANK.get(level, _LEVEL_RANK["info"]) >= _LEVEL_RANK[self.log_level]


def parse(params: Any) -> Envelope:
    """Read the envelope from PARAMS; raise InvalidParams if it is missing or malformed."""
    meta = params.get("_meta") if isinstance(params, dict) else None
    if not isinstance(meta, dict):
        raise InvalidParams(MISSING_ENVELOPE)
    version = meta.get(PROTOCOL_VERSION)
    capabilities = meta.get(CLIENT_CAPABILITIES)
    if not isinstance(version, str) or not version:
        raise InvalidParams(f"{MISSING_ENVELOPE}: '{PROTOCOL_VERSION}' must be a string")
    if not isinstance(capabilities, dict):
        raise InvalidParams(f"{MISSING_ENVELOPE}: '{CLIENT_CAPABILITIES}' must be an object")
    client_info = meta.get(CLIENT_INFO)
    if client_info is not None and not isinstance(client_info, dict):
        raise InvalidParams(f"_meta['{CLIENT_INFO}'] must be an object")
    log_level = meta.get(LOG_LEVEL)
    if log_level is not None and (not isinstance(log_level, str) or log_level not in _LEVEL_RANK):
        raise InvalidParams(f"_meta['{LOG_LEVEL}'] must be one of {', '.join(LOG_LEVELS)}")
    token = meta.get("progressToken")
    if token is not None and (isinstance(token, bool) or not isinstance(token, str | int)):
        raise InvalidParams("_meta.progressToken must be a string or an integer")
    return Envelope(
        protocol_version=version,
        capabilities=capabilities,
        client_info=client_info,
        log_level=log_level,
        progress_token=token,
        meta=meta,
    )
