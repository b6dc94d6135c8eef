"""What a bearer token grants the MCP endpoint, whichever issuer signed it: an ``Access``.

``tasks_app.oauth.bearer.verify(token)`` turns an OAuth access token into one (it asks the
built-in authorization server, ``tasks_app.oauth.builtin``, and then the external issuers,
``tasks_app.oauth.issuers``); ``static`` gives one to Taskdesk's own client tokens (``tdk_``),
which carry every scope. The endpoint keeps it as DRF's ``request.auth``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tasks_app.models import Client

# The scopes a client may hold (docs/clients.md, "Scopes").
CALL = "tasks:call"  # call tools, follow and cancel one's own tasks
ANSWER = "tasks:answer"  # answer questions routed to the client
SCOPES = (CALL, ANSWER)
ALL_SCOPES = frozenset(SCOPES)


@dataclass(frozen=True)
class Access:
    """A verified access token: the Taskdesk client it acts as and what it may do."""

    client: Client
    scopes: frozenset[str]
    # Who signed the token: the built-in server's issuer URL or an external issuer's.
    issuer: str
    # The OAuth client (app) the token was issued to, as a name people recognise.
    app: str = ""
    # The person who approved it (the built-in server's user id and username), when there is one.
    person_id: int | None = None
    person_name: str = ""
    # The built-in server's grant, for revocation and "last used".
    grant_id: int | None = None
    # Tools the token may call; empty means every tool the client may call.
    tools: frozenset[str] = field(default_factory=frozenset)
    # When the token expires (seconds since the epoch), if it says; a process remembers a
    # verified token no longer than that (tasks_app.oauth.bearer).
    expires_at: float | None = None

    def allowed_tools(self) -> frozenset[str] | None:
        """The names of the tools this access may call, or None for every tool: the client's
        ``allowed_tools`` (set by an operator) narrowed further by the token's own ``tools``."""
        allowed = _names(self.client.allowed_tools)
        if self.tools:
            allowed = self.tools if allowed is None else allowed & self.tools
        return allowed

    def may_call(self, tool: str) -> bool:
        allowed = self.allowed_tools()
        return allowed is None or tool in allowed


# What a Taskdesk client token (tdk_) names as its issuer: no OAuth server signed it.
STATIC_ISSUER = ""


def static(client: Client) -> Access:
    """What a Taskdesk client token of CLIENT grants: every scope (the client's own
    ``allowed_tools`` still narrows its tools)."""
    return Access(client=client, scopes=ALL_SCOPES, issuer=STATIC_ISSUER)


def _names(value: object) -> frozenset[str] | None:
    """``Client.allowed_tools`` as a set; None when it is empty (every tool). Anything but a
    list of names (the admin only saves lists) allows no tool rather than every tool."""
    if not value:
        return None
    if not isinstance(value, list):
        return frozenset()
    return frozenset(name for name in value if isinstance(name, str))
