"""The clients of test_oauth_clients.py and what they are given: client ID metadata documents
served over https on 127.0.0.1 (``Documents``), the TypeScript SDK's script
(tests/clients/node/oauth.mjs) as it runs (``NodeClient``), and the Python SDK signing in in a
thread of its own (``PythonSdk``) with an app's loopback redirect URI (``Redirects``)."""

from __future__ import annotations

import json
import queue
import ssl
import subprocess
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast
from urllib.parse import parse_qsl, urlsplit

import anyio
import mcp_types
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.extension import ClaimContext
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthToken,
)

from tests import clients
from tests.integration.test_sdk_client import (
    CreateTaskResult,
    Tasks,
    confirm_everything,
    in_tasks_get_only,
)
from tests.live import LiveStack

KEY_META = "dev.taskdesk/idempotencyKey"
EXPORT = {"quarter": "Q3", "format": "csv", "rows": 40}
# How long a client waits for the next thing it expects (a line, a redirect, a task's end).
WAIT = 60


def redirect_uri(port: int) -> str:
    return f"http://127.0.0.1:{port}/callback"


# --- client ID metadata documents --------------------------------------------------------------


def certificate(folder: Path) -> tuple[str, str]:
    """A self-signed certificate (its own CA) for the address 127.0.0.1: (certificate file,
    key file)."""
    import ipaddress
    from datetime import UTC, datetime, timedelta

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(hours=1))
        .not_valid_after(now + timedelta(hours=3))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = folder / "cert.pem", folder / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return str(cert_file), str(key_file)


class Documents:
    """Client ID metadata documents served over https on 127.0.0.1, with a certificate made
    here for that address (``ca_file``, which the stack trusts)."""

    def __init__(self, folder: Path) -> None:
        self.ca_file, key_file = certificate(folder)
        self.documents: dict[str, bytes] = {}
        self.fetches: list[str] = []
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(self.ca_file, key_file)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.base = f"https://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def app(self, name: str, redirect_uri: str) -> str:
        """Publish the document of an app called NAME at a path of its own; return its URL,
        the app's client_id."""
        path = f"/apps/{uuid.uuid4().hex[:8]}/client.json"
        url = self.base + path
        document = {
            "client_id": url,
            "client_name": name,
            "redirect_uris": [redirect_uri],
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "token_endpoint_auth_method": "none",
        }
        self.documents[path] = json.dumps(document).encode()
        return url

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        host = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                host.fetches.append(self.path)
                body = host.documents.get(self.path, b"")
                self.send_response(200 if body else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# --- the TypeScript SDK -----------------------------------------------------------------------


class NodeClient:
    """tests/clients/node/oauth.mjs, running with its redirect URI on REDIRECT_PORT: its JSON
    lines, read as they come."""

    def __init__(self, stack: LiveStack, name: str, redirect_port: int, **options: str) -> None:
        command = [
            str(clients.node()),
            "oauth.mjs",
            "--url",
            stack.mcp_url,
            "--redirect-port",
            str(redirect_port),
            "--name",
            name,
            "--key",
            f"oauth-{uuid.uuid4().hex[:8]}",
        ]
        for option, value in options.items():
            command += [f"--{option.replace('_', '-')}", value]
        self.proc = subprocess.Popen(
            command,
            cwd=clients.NODE_DIR,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        self.stderr: list[str] = []
        self.readers = [
            threading.Thread(target=self._read, daemon=True),
            threading.Thread(target=self._read_stderr, daemon=True),
        ]
        for reader in self.readers:
            reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))
        self.lines.put(None)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        self.stderr.extend(self.proc.stderr)

    def next(self, event: str) -> dict[str, Any]:
        """The next line of EVENT (every line read is kept in ``seen``)."""
        while True:
            try:
                line = self.lines.get(timeout=WAIT)
            except queue.Empty:
                raise AssertionError(f"no {event} line within {WAIT} s: {self.seen}") from None
            if line is None:
                raise AssertionError(f"the client ended before {event}: {self.finish()}")
            self.seen.append(line)
            if line["event"] == event:
                return line

    def events(self) -> list[str]:
        return [line["event"] for line in self.seen]

    def finish(self) -> str:
        """Wait for the script to end; say how it ended: its exit status, every line it
        printed, its standard error."""
        try:
            self.proc.wait(WAIT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for reader in self.readers:
            reader.join(10)
        while not self.lines.empty():
            line = self.lines.get()
            if line is not None:
                self.seen.append(line)
        stderr = "".join(self.stderr)
        return f"exit status {self.proc.returncode}; lines {self.seen}; stderr:\n{stderr}"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


# --- the Python SDK ---------------------------------------------------------------------------


class Redirects:
    """An app's redirect URI on 127.0.0.1: the query of each request to /callback, in order."""

    def __init__(self) -> None:
        self.received: queue.Queue[dict[str, str]] = queue.Queue()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.uri = redirect_uri(self.server.server_port)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        redirects = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                if parts.path != "/callback":
                    self.send_error(404)
                    return
                params = dict(parse_qsl(parts.query))
                outcome = "Signed in" if "code" in params else "Not signed in"
                body = f'<!doctype html><h1 id="outcome">{outcome}</h1>'.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                redirects.received.put(params)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Memory:
    """The SDK's TokenStorage, in memory."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client_info: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client_info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client_info = client_info


class RecordingTasks(Tasks):
    """test_sdk_client's tasks extension, noting the id of each task it follows."""

    def __init__(self) -> None:
        super().__init__(confirm_everything)
        self.task_ids: list[str] = []

    async def drive(self, created: CreateTaskResult, ctx: ClaimContext) -> mcp_types.CallToolResult:
        self.task_ids.append(created.task_id)
        return await super().drive(created, ctx)


class PythonSdk(threading.Thread):
    """The Python SDK signing in with its OAuthClientProvider and calling export_report, in
    a thread of its own (Playwright's sync API holds this one). Its redirect handler hands
    the authorization URL over (``authorize``); its callback handler waits for REDIRECTS."""

    def __init__(self, stack: LiveStack, app: str, client_id: str, redirects: Redirects) -> None:
        super().__init__(daemon=True)
        self.stack, self.app, self.client_id, self.redirects = stack, app, client_id, redirects
        self.authorize: queue.Queue[str] = queue.Queue()
        self.storage = Memory()
        self.tasks = RecordingTasks()
        self.result: mcp_types.CallToolResult | None = None
        self.protocol_version: str | None = None
        self.error: BaseException | None = None

    def authorization_url(self) -> str:
        """The URL the SDK sends the person to (what it raised, if it ended first)."""
        for _ in range(WAIT * 10):
            try:
                return self.authorize.get(timeout=0.1)
            except queue.Empty:
                if not self.is_alive():
                    raise AssertionError(f"the SDK ended first: {self.error!r}") from None
        raise AssertionError(f"no authorization URL within {WAIT} s")

    def run(self) -> None:
        try:
            self.result = anyio.run(self.export)
        except BaseException as exc:
            self.error = exc

    async def export(self) -> mcp_types.CallToolResult:
        metadata = OAuthClientMetadata(
            client_name=self.app,
            redirect_uris=[self.redirects.uri],  # type: ignore[list-item]
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            token_endpoint_auth_method="none",
        )
        provider = OAuthClientProvider(
            self.stack.mcp_url,
            metadata,
            self.storage,
            redirect_handler=self._redirect,
            callback_handler=self._callback,
            client_metadata_url=self.client_id,
        )
        http = create_mcp_http_client(auth=provider)
        transport = streamable_http_client(self.stack.mcp_url, http_client=http)
        async with (
            http,
            Client(transport, extensions=[self.tasks], elicitation_callback=in_tasks_get_only) as c,
        ):
            self.protocol_version = c.protocol_version
            # The key is an extra item of the TypedDict, which mypy cannot see in a literal.
            key = f"oauth-{uuid.uuid4().hex[:8]}"
            meta = cast(mcp_types.RequestParamsMeta, {KEY_META: key})
            return await c.call_tool("export_report", EXPORT, meta=meta)

    async def _redirect(self, url: str) -> None:
        self.authorize.put(url)

    async def _callback(self) -> AuthorizationCodeResult:
        params = await anyio.to_thread.run_sync(lambda: self.redirects.received.get(timeout=WAIT))
        return AuthorizationCodeResult(
            code=params["code"], state=params.get("state"), iss=params.get("iss")
        )
