"""Fixtures of the OAuth tests: a local identity provider shaped like a Keycloak realm (its
OpenID Connect metadata and JWK set served over real HTTP on 127.0.0.1, its tokens signed with
RSA keys made here), and MCP posters holding its tokens.

``keycloak.token(...)`` signs an access token for the MCP endpoint; ``keycloak.rotate()``
replaces the signing key by a new one (new ``kid``, the old key gone from the set), as a
realm's key rotation does.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from django.test import Client as HttpClient
from jwt.algorithms import RSAAlgorithm

from config.env import OAuthIssuer
from tests.tasks_app.mcp.conftest import Mcp

PUBLIC_URL = "https://taskdesk.example.com"
RESOURCE = PUBLIC_URL + "/mcp"
METADATA_URL = PUBLIC_URL + "/.well-known/oauth-protected-resource/mcp"
INVALID_CHALLENGE = f'Bearer error="invalid_token", resource_metadata="{METADATA_URL}"'
REALM_PATH = "/realms/acme"


def new_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


class Keycloak:
    """A realm's discovery document and JWK set on a local HTTP server, and its tokens."""

    def __init__(self) -> None:
        self.documents: dict[str, Any] = {}
        self.fetches: Counter[str] = Counter()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.base = f"http://127.0.0.1:{self.server.server_port}"
        self.issuer = self.base + REALM_PATH
        self.jwks_path = REALM_PATH + "/protocol/openid-connect/certs"
        self.documents[REALM_PATH + "/.well-known/openid-configuration"] = {
            "issuer": self.issuer,
            "jwks_uri": self.base + self.jwks_path,
            "token_endpoint": self.issuer + "/protocol/openid-connect/token",
        }
        self.generation = 0
        self.key = new_key()
        self.kid = "key-0"
        self.publish()
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        realm = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                realm.fetches[self.path] += 1
                document = realm.documents.get(self.path)
                body = json.dumps(document).encode()
                self.send_response(200 if document is not None else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler

    def publish(self) -> None:
        jwk = RSAAlgorithm.to_jwk(self.key.public_key(), as_dict=True)
        # An encryption key beside the signing key, as a Keycloak realm publishes one.
        enc = {**RSAAlgorithm.to_jwk(self.key.public_key(), as_dict=True), "kid": "enc"}
        self.documents[self.jwks_path] = {
            "keys": [
                {**jwk, "kid": self.kid, "use": "sig", "alg": "RS256"},
                {**enc, "use": "enc", "alg": "RSA-OAEP"},
            ]
        }

    def rotate(self) -> None:
        """A new signing key with a new kid; the old one leaves the set."""
        self.generation += 1
        self.key = new_key()
        self.kid = f"key-{self.generation}"
        self.publish()

    def claims(self, **overrides: Any) -> dict[str, Any]:
        now = int(time.time())
        claims = {
            "iss": self.issuer,
            "aud": RESOURCE,
            "sub": "f3a1-user",
            "azp": "claude-desktop",
            "scope": "openid tasks:call tasks:answer",
            "iat": now,
            "exp": now + 300,
            "jti": uuid.uuid4().hex,
        }
        claims.update(overrides)
        return {k: v for k, v in claims.items() if v is not None}

    def token(self, *, key: Any = None, kid: str | None = None, alg: str = "RS256",
              **claims: Any) -> str:  # fmt: skip
        return jwt.encode(
            self.claims(**claims),
            key if key is not None else self.key,
            algorithm=alg,
            headers={"kid": kid or self.kid},
        )

    def settings_entry(self, **entry: Any) -> OAuthIssuer:
        values: dict[str, Any] = {"clients": {"claude-desktop": "alice"}, **entry}
        return OAuthIssuer(issuer=self.issuer, **values)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def realm() -> Iterator[Keycloak]:
    keycloak = Keycloak()
    yield keycloak
    keycloak.close()


@pytest.fixture
def keycloak(realm: Keycloak, settings: Any) -> Iterator[Keycloak]:
    """The realm as the one external issuer, mapping its app claude-desktop to alice."""
    from tasks_app.oauth import bearer, jwks

    settings.TASKDESK_PUBLIC_URL = PUBLIC_URL
    settings.TASKDESK_OAUTH_ISSUERS = (realm.settings_entry(),)
    settings.TASKDESK_OAUTH_JWKS_REFETCH_SECONDS = 0
    jwks.forget()
    bearer.forget_cached()
    realm.publish()  # what an earlier test added to the key set leaves it
    realm.fetches.clear()
    yield realm
    jwks.forget()
    bearer.forget_cached()


@pytest.fixture
def oauth_mcp(client: HttpClient, keycloak: Keycloak, alice: Any) -> Mcp:
    """Alice's MCP client signed in through the realm with both scopes."""
    return Mcp(client, keycloak.token())


@pytest.fixture
def call_only_mcp(client: HttpClient, keycloak: Keycloak, alice: Any) -> Mcp:
    """Alice's MCP client signed in with tasks:call only."""
    return Mcp(client, keycloak.token(scope="tasks:call"))


@pytest.fixture
def mcp(client: HttpClient, alice_token: str) -> Mcp:
    """Alice's MCP client with her static token (tdk_)."""
    return Mcp(client, alice_token)
