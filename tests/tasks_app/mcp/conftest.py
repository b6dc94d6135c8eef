"""Fixtures of the MCP endpoint tests: ``mcp`` (alice) and ``bob_mcp`` post to /mcp through
Django's test client. What goes on the wire is built and read by ``tests.wire``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client as HttpClient

from tests.wire import (
    HANDSHAKE_VERSION,
    SESSION_HEADER,
    handshake_headers,
    headers_for,
    initialize,
    request,
    rpc,
)


class Mcp:
    """Posts to /mcp through Django's test client."""

    def __init__(self, http: HttpClient, token: str | None) -> None:
        self.http = http
        self.token = token

    def post(
        self,
        body: Any = None,
        *,
        raw: bytes | None = None,
        headers: dict[str, str | None] | None = None,
        token: str | None = "default",
        content_type: str = "application/json",
    ) -> Any:
        hdrs: dict[str, str | None] = headers_for(body)
        token = self.token if token == "default" else token
        if token:
            hdrs["Authorization"] = f"Bearer {token}"
        hdrs.update(headers or {})
        sent = {k: v for k, v in hdrs.items() if v is not None}
        data = raw if raw is not None else json.dumps(body).encode()
        return self.http.post("/mcp", data=data, content_type=content_type, headers=sent)

    def call(self, method: str, params: dict[str, Any] | None = None, **env: Any) -> Any:
        return self.post(request(method, params, **env))


class Session:
    """A 2025-11-25 session opened with ``initialize`` through MCP (Django's test client)."""

    def __init__(
        self,
        mcp: Mcp,
        version: str = HANDSHAKE_VERSION,
        capabilities: dict[str, Any] | None = None,
    ) -> None:
        self.mcp = mcp
        response = mcp.post(
            initialize(version, capabilities), headers=handshake_headers(None, None)
        )
        assert response.status_code == 200, response.content
        self.id: str = response[SESSION_HEADER]
        self.result: dict[str, Any] = json.loads(response.content)["result"]
        self.version: str = self.result["protocolVersion"]

    def post(self, body: Any, **headers: str | None) -> Any:
        return self.mcp.post(body, headers={**handshake_headers(self.id, self.version), **headers})

    def call(self, method: str, params: dict[str, Any] | None = None, **headers: str | None) -> Any:
        return self.post(rpc(method, params), **headers)

    def stream_headers(self, **extra: str) -> dict[str, str]:
        """The headers of a GET on this session's stream (EXTRA: e.g. Last-Event-ID)."""
        return {
            "Authorization": f"Bearer {self.mcp.token}",
            SESSION_HEADER: self.id,
            "Accept": "text/event-stream",
            **extra,
        }


@pytest.fixture
def mcp(client: HttpClient, alice_token: str) -> Mcp:
    return Mcp(client, alice_token)


@pytest.fixture
def bob_mcp(client: HttpClient, bob_token: str) -> Mcp:
    return Mcp(client, bob_token)
