"""A local webhook receiver for the tests: it verifies every delivery with the
``standardwebhooks`` reference library and answers as scripted."""

from __future__ import annotations

import json
import ssl
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks.webhooks import Webhook, WebhookVerificationError


@dataclass
class Delivery:
    webhook_id: str
    headers: dict[str, str]
    body: dict[str, Any]
    verified: bool
    status: int


@dataclass
class Receiver:
    """Answers the statuses in SCRIPT in turn (then 200); HOLD_FIRST seconds before answering
    the first request (a delivery in flight), HOLD_EACH seconds before answering every one (a
    slow endpoint); ``most_at_once`` is the most requests it held at the same time."""

    secret: str = ""
    script: list[int] = field(default_factory=list)
    hold_first: float = 0.0
    hold_each: float = 0.0
    most_at_once: int = 0
    # HTTP/1.1 with connections kept alive (as most receivers answer), or HTTP/1.0: one
    # request per connection; ``connections`` counts the connections senders opened.
    keep_alive: bool = True
    connections: int = 0
    answer_body: bytes = b"ok"
    # TLS: (certificate file, key file) to serve https; the SNI names the senders gave.
    tls: tuple[str, str] | None = None
    server_names: list[str | None] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)
    received: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._at_once = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if self.keep_alive else "HTTP/1.0"
            # Headers and body are two writes: with Nagle's algorithm the body would wait for
            # the sender's delayed ACK (40 ms) on a kept-alive connection.
            disable_nagle_algorithm = True

            def setup(self) -> None:
                super().setup()
                with receiver._lock:
                    receiver.connections += 1

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length).decode()
                headers = {k.lower(): v for k, v in self.headers.items()}
                receiver.answer(self, raw, headers)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hooks/taskdesk"
        if self.tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*self.tls)
            context.sni_callback = lambda sock, name, ctx: self.server_names.append(name)  # type: ignore[assignment,func-returns-value]
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def answer(self, handler: BaseHTTPRequestHandler, raw: str, headers: dict[str, str]) -> None:
        try:
            body = Webhook(self.secret).verify(raw, headers)
            verified = True
        except WebhookVerificationError:
            body, verified = json.loads(raw), False
        with self._lock:
            first = not self.deliveries
            status = self.script.pop(0) if self.script else 200
            self.deliveries.append(
                Delivery(headers.get("webhook-id", ""), headers, body, verified, status)
            )
            self._at_once += 1
            self.most_at_once = max(self.most_at_once, self._at_once)
        self.received.set()
        if first and self.hold_first:
            threading.Event().wait(self.hold_first)
        if self.hold_each:
            threading.Event().wait(self.hold_each)
        with self._lock:
            self._at_once -= 1
        try:
            handler.send_response(status)
            handler.send_header("Content-Length", str(len(self.answer_body)))
            handler.end_headers()
            handler.wfile.write(self.answer_body)
        except OSError:
            pass  # the sender went away (killed mid-delivery)

    def ids(self) -> set[str]:
        with self._lock:
            return {d.webhook_id for d in self.deliveries}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
