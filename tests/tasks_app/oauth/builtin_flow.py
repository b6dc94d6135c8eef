"""Helpers of the built-in authorization server's tests: an app that registers itself, a
client ID metadata document served over real HTTP on 127.0.0.1, PKCE pairs, and the steps of
the authorization code flow through Django's test client."""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from django.test import Client as HttpClient

PUBLIC_URL = "https://taskdesk.example.com"
RESOURCE = PUBLIC_URL + "/mcp"
REDIRECT_URI = "http://127.0.0.1:33418/callback"
FORM = "application/x-www-form-urlencoded"


def pkce() -> tuple[str, str]:
    """A code verifier and its S256 challenge."""
    verifier = secrets.token_urlsafe(48)
    digest = hashlib.sha256(verifier.encode()).digest()
    return verifier, base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def register(http: HttpClient, **metadata: Any) -> Any:
    body = {
        "client_name": "Claude Desktop",
        "redirect_uris": [REDIRECT_URI],
        "token_endpoint_auth_method": "none",
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        **metadata,
    }
    body = {k: v for k, v in body.items() if v is not None}
    return http.post("/oauth/register", data=json.dumps(body), content_type="application/json")


def registered(http: HttpClient, **metadata: Any) -> str:
    """The client_id of a newly registered public app."""
    response = register(http, **metadata)
    assert response.status_code == 201, response.content
    return str(json.loads(response.content)["client_id"])


def authorize_query(client_id: str, challenge: str, **overrides: Any) -> str:
    params: dict[str, Any] = {
        "response_type": "code",
        "client_id": client_id,
        "redirect_uri": REDIRECT_URI,
        "code_challenge": challenge,
        "code_challenge_method": "S256",
        "resource": RESOURCE,
        "scope": "tasks:call tasks:answer",
        "state": "st-123",
        **overrides,
    }
    return urlencode({k: v for k, v in params.items() if v is not None})


def query_of(location: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(location).query).items()}


def approve(http: HttpClient, query: str, tenant: Any) -> dict[str, str]:
    """Show the consent page of QUERY, approve it for TENANT, and return the redirect's
    parameters (code, state, iss)."""
    page = http.get(f"/oauth/authorize?{query}")
    assert page.status_code == 200, page.content
    answer = http.post(f"/oauth/authorize?{query}", {"tenant": tenant.pk, "decision": "approve"})
    assert answer.status_code == 302, answer.content
    assert answer["Location"].startswith(REDIRECT_URI + "?")
    return query_of(answer["Location"])


def exchange(http: HttpClient, client_id: str, code: str, verifier: str, **overrides: Any) -> Any:
    data: dict[str, Any] = {
        "grant_type": "authorization_code",
        "code": code,
        "redirect_uri": REDIRECT_URI,
        "client_id": client_id,
        "code_verifier": verifier,
        "resource": RESOURCE,
        **overrides,
    }
    body = urlencode({k: v for k, v in data.items() if v is not None})
    return http.post("/oauth/token", data=body, content_type=FORM)


def refresh(http: HttpClient, client_id: str, refresh_token: str, **overrides: Any) -> Any:
    data: dict[str, Any] = {
        "grant_type": "refresh_token",
        "refresh_token": refresh_token,
        "client_id": client_id,
        "resource": RESOURCE,
        **overrides,
    }
    body = urlencode({k: v for k, v in data.items() if v is not None})
    return http.post("/oauth/token", data=body, content_type=FORM)


def tokens_for(http: HttpClient, person: Any, tenant: Any, client_id: str = "") -> dict[str, Any]:
    """Sign PERSON in, approve a (new, registered) app for TENANT and exchange the code:
    the token response, with the app's client_id."""
    client_id = client_id or registered(http)
    http.force_login(person)
    verifier, challenge = pkce()
    params = approve(http, authorize_query(client_id, challenge), tenant)
    response = exchange(http, client_id, params["code"], verifier)
    assert response.status_code == 200, response.content
    return {**json.loads(response.content), "client_id": client_id}


class DocumentHost:
    """Client ID metadata documents served over HTTP on 127.0.0.1, by path."""

    def __init__(self) -> None:
        self.documents: dict[str, bytes] = {}
        self.headers: dict[str, dict[str, str]] = {}
        self.fetches: Counter[str] = Counter()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.base = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return self.base + path

    def publish(self, path: str, document: Any, **headers: str) -> str:
        raw = document if isinstance(document, bytes) else json.dumps(document).encode()
        self.documents[path] = raw
        self.headers[path] = headers
        return self.url(path)

    def app(self, path: str = "/client.json", **fields: Any) -> str:
        """Publish a valid document for an app at PATH; return its client_id."""
        document = {
            "client_id": self.url(path),
            "client_name": "Cursor",
            "redirect_uris": [REDIRECT_URI],
            "token_endpoint_auth_method": "none",
            **fields,
        }
        return self.publish(path, {k: v for k, v in document.items() if v is not None})

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        host = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                host.fetches[self.path] += 1
                body = host.documents.get(self.path)
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Type", "application/json")
                for name, value in host.headers.get(self.path, {}).items():
                    self.send_header(name.replace("_", "-"), value)
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                self.wfile.write(body or b"")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def document_host() -> Iterator[DocumentHost]:
    host = DocumentHost()
    try:
        yield host
    finally:
        host.close()
