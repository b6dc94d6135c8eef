"""Requests from the server to addresses outside it: where they may go, and the exchange.

Three callers send them: webhook deliveries (``tasks_app.webhooks``), the chat posts of the
questions' notices (``elicitations.sending``) and the fetches of client ID metadata documents
(``tasks_app.authserver.documents``). Each URL is checked and its host resolved once
(``resolve``): https only (http to a loopback address, where its ``Reach`` allows it), and
only public addresses unless ``Reach`` names more networks. The connection is then made to
that checked address, with the name in the Host header and in TLS (SNI and the certificate
check), so a name that resolves differently the second time reaches nothing unchecked.

``Connection`` POSTs over one kept-alive connection (``post`` once); ``pool_for`` and
``request`` make one-off requests through urllib3 for callers that read the answer's body.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
import select
import socket
import ssl
import time
from dataclasses import dataclass
from functools import cache
from urllib.parse import urlsplit

import urllib3
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# The most of an answer's body that is read (the rest is dropped with the connection).
_ANSWER_BYTES = 4096


class UnsafeUrl(ValueError):
    """A URL that may not be called (its scheme, or where its host resolves)."""


# --- where a request may go -----------------------------------------------------------------


@cache
def _allowed_networks(text: tuple[str, ...]) -> tuple[IpNetwork, ...]:
    try:
        return tuple(ipaddress.ip_network(n.strip(), strict=False) for n in text if n.strip())
    except ValueError as exc:
        raise ImproperlyConfigured(f"TASKDESK_WEBHOOK_ALLOWED_NETWORKS: {exc}") from None


def _address_allowed(address: IpAddress, rules: Reach) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    if any(address in n for n in _allowed_networks(rules.networks)):
        return True
    if address.is_loopback:
        return rules.loopback
    return address.is_global and not address.is_multicast


@dataclass(frozen=True)
class Reach:
    """Which addresses an outgoing request may go to beyond public ones: loopback (then over
    http too), and these networks (CIDR). The webhooks' come from their settings; other
    callers (client ID metadata documents) pass their own. HINT tells whoever reads a refusal
    which setting widens it."""

    loopback: bool
    networks: tuple[str, ...] = ()
    hint: str = ""

    @classmethod
    def of_webhooks(cls) -> Reach:
        return cls(
            loopback=bool(settings.TASKDESK_WEBHOOK_ALLOW_HTTP_LOOPBACK),
            networks=tuple(settings.TASKDESK_WEBHOOK_ALLOWED_NETWORKS),
            hint="allow its network with TASKDESK_WEBHOOK_ALLOWED_NETWORKS",
        )


@dataclass(frozen=True)
class Target:
    """Where one delivery goes: the URL's parts and the checked address to connect to."""

    scheme: str
    host: str
    port: int
    path: str
    address: str

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"


def resolve(url: str, rules: Reach | None = None) -> Target:
    """Check URL and resolve its host once; raise UnsafeUrl if it may not be called. RULES:
    where it may go beyond public addresses (the webhooks' settings unless given)."""
    rules = rules or Reach.of_webhooks()
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("https", "http"):
        raise UnsafeUrl("the URL must start with https://")
    if parts.username or parts.password:
        raise UnsafeUrl("the URL may not carry a user name or password")
    host = parts.hostname
    if not host:
        raise UnsafeUrl("the URL has no host")
    try:
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError:
        raise UnsafeUrl("the URL's port is not a number") from None
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError) as exc:
        raise UnsafeUrl(f"the host {host} cannot be resolved ({exc})") from None
    addresses = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in found]
    if not addresses:
        raise UnsafeUrl(f"the host {host} has no address")
    refused = [a for a in addresses if not _address_allowed(a, rules)]
    if refused:
        hint = f" ({rules.hint})" if rules.hint else ""
        raise UnsafeUrl(
            f"the host {host} resolves to {refused[0]}, a private or special address{hint}"
        )
    if scheme == "http" and not (rules.loopback and all(a.is_loopback for a in addresses)):
        raise UnsafeUrl("the URL must start with https:// (http only to a loopback address)")
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return Target(scheme=scheme, host=host, port=port, path=path, address=str(addresses[0]))


# --- the exchange ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    status_code: int | None
    latency_ms: int
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


class Connection:
    """Deliveries to one URL over one kept-alive connection: the URL is checked and its host
    resolved once, when the connection is opened, and every POST goes to that checked
    address (a receiver that closes the connection gets a new one, to the same address).
    No redirects, short timeouts, at most ``_ANSWER_BYTES`` of an answer read.

    The exchange is written here (``_request_bytes``, ``_read_answer``) rather than on the
    standard library's ``http.client``: a delivery needs the status line and the length of
    what follows, and ``http.client`` parses every answer's headers with the ``email``
    package. To a local nginx a POST cost 210-255 us of CPU with ``http.client``, 245 us with
    ``h11`` and 80 us written out, most of that the two system calls (a 2-core EPYC,
    2026-12-07); urllib3's pool (which the one-off requests of ``request`` use) costs more
    than ``http.client``."""

    def __init__(self, url: str) -> None:
        self._sock: socket.socket | None = None
        self._idle_since = 0.0  # when the last answer on the socket was read
        try:
            self._target: Target | None = resolve(url)
            self._refused = ""
        except UnsafeUrl as exc:
            self._target, self._refused = None, f"refused: {exc}"

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None

    def _opened(self, target: Target) -> socket.socket:
        """The kept-alive socket to TARGET's checked address, opened again if the receiver
        closed it meanwhile: at most five seconds to connect, then the timeout for each
        read; over TLS with the target's name in SNI and in the certificate check. A socket
        idle for ``_IDLE_CHECK_SECONDS`` is looked at before it is used again (a receiver's
        idle timeout closes it, or answers nobody's request, 408, before closing); between
        the deliveries of a batch, a moment apart, that look is not made (a system call
        each)."""
        idle = time.monotonic() - self._idle_since
        if self._sock is not None and idle > _IDLE_CHECK_SECONDS and _dropped(self._sock):
            self.close()  # the receiver closed it (or sent what nobody asked for)
        if self._sock is None:
            seconds = settings.TASKDESK_WEBHOOK_TIMEOUT_SECONDS
            context = (
                _tls_context(settings.TASKDESK_WEBHOOK_CA_FILE)
                if target.scheme == "https"
                else None
            )
            sock = socket.create_connection((target.address, target.port), min(seconds, 5.0))
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.settimeout(seconds)
                if context is not None:
                    sock = context.wrap_socket(sock, server_hostname=target.host)
            except BaseException:
                sock.close()
                raise
            self._sock = sock
        return self._sock

    def post(self, body: str, headers: dict[str, str]) -> Answer:
        """POST BODY once."""
        started = time.monotonic()

        def took() -> int:
            return int((time.monotonic() - started) * 1000)

        if self._target is None:
            return Answer(None, took(), self._refused)
        target = self._target
        sent = {
            **headers,
            "Host": target.host_header,
            "Content-Type": "application/json",
            "User-Agent": "Taskdesk-Webhooks",
        }
        try:
            request = _request_bytes(target.path, sent, body.encode())
            # Inside the try: an unreadable TASKDESK_WEBHOOK_CA_FILE is this attempt's error.
            kept_alive = self._sock is not None
            try:
                status, reusable = self._exchange(target, request)
            except (Unanswered, ConnectionResetError, BrokenPipeError):
                if not kept_alive:
                    raise
                # A kept-alive connection the receiver had closed: sent again on a new one.
                status, reusable = self._exchange(target, request)
        except (BadAnswer, ValueError, OSError) as exc:  # TLS errors are OSErrors
            self.close()
            return Answer(None, took(), f"{type(exc).__name__}: {exc}")
        if not reusable:  # more than is read, of unknown length, or closed by the receiver
            self.close()
        error = "" if 200 <= status < 300 else f"HTTP {status}"
        return Answer(status, took(), error)

    def _exchange(self, target: Target, request: bytes) -> tuple[int, bool]:
        try:
            sock = self._opened(target)
            sock.sendall(request)
            answer = _read_answer(sock)
        except BaseException:
            self.close()
            raise
        self._idle_since = time.monotonic()
        return answer


class BadAnswer(Exception):
    """An answer that is not HTTP/1.x as a receiver sends it."""


class Unanswered(BadAnswer):
    """The receiver closed the connection before the first byte of an answer."""


# How long a kept-alive socket may sit idle before it is checked before its next use.
_IDLE_CHECK_SECONDS = 0.5
# The most of an answer's status line and headers that is read.
_HEAD_BYTES = 65536
_UNSAFE_IN_HEADER = re.compile(r"[\r\n\0]")
_UNSAFE_IN_PATH = re.compile(r"[\x00-\x20\x7f]")


def _request_bytes(path: str, headers: dict[str, str], body: bytes) -> bytes:
    """A POST of BODY to PATH with HEADERS, as sent on the wire. A header or path that could
    end a line (or the request) early is refused (ValueError)."""
    if _UNSAFE_IN_PATH.search(path):
        raise ValueError("the URL's path holds a control character or a space")
    lines = [f"POST {path} HTTP/1.1"]
    for name, value in headers.items():
        if _UNSAFE_IN_HEADER.search(name) or _UNSAFE_IN_HEADER.search(value):
            raise ValueError(f"the header {name!r} holds a line break")
        lines.append(f"{name}: {value}")
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _read_answer(sock: socket.socket) -> tuple[int, bool]:
    """Read one answer on SOCK: its status, and whether the connection may carry the next
    request (the answer's body, if any, was read whole, within ``_ANSWER_BYTES``, and the
    receiver keeps the connection). Interim (1xx) answers are skipped."""
    buffer = b""
    while True:
        while (end := buffer.find(b"\r\n\r\n")) < 0:
            if len(buffer) > _HEAD_BYTES:
                raise BadAnswer("the answer's headers are too long")
            chunk = sock.recv(65536)
            if not chunk:
                if buffer:
                    raise BadAnswer("the receiver closed the connection in its answer")
                raise Unanswered("the receiver closed the connection before answering")
            buffer += chunk
        head, buffer = buffer[:end].decode("latin-1"), buffer[end + 4 :]
        status_line, *fields = head.split("\r\n")
        version, _, rest = status_line.partition(" ")
        code = rest[:3]
        if not version.startswith("HTTP/1.") or not code.isdigit() or rest[3:4] not in ("", " "):
            raise BadAnswer(f"not an HTTP/1.x status line: {status_line[:100]!r}")
        status = int(code)
        if status == 101:
            return status, False  # switching to another protocol: not for the next POST
        if status >= 200:
            break
    found: dict[str, str] = {}
    for field in fields:
        name, colon, value = field.partition(":")
        if colon:
            found[name.strip().lower()] = value.strip().lower()
    keep = "close" not in found.get("connection", "") and (
        version != "HTTP/1.0" or "keep-alive" in found.get("connection", "")
    )
    if status in (204, 304):
        return status, keep and not buffer
    if "transfer-encoding" in found or not found.get("content-length", "").isdigit():
        return status, False  # its end is not known without reading it all
    length = int(found["content-length"])
    if length > _ANSWER_BYTES:
        return status, False
    while len(buffer) < length:
        chunk = sock.recv(length - len(buffer))
        if not chunk:
            return status, False
        buffer += chunk
    return status, keep and len(buffer) == length


@cache
def _tls_context(ca_file: str | None) -> ssl.SSLContext:
    """Certificates checked against CA_FILE (the system's authorities without one), and the
    host name against the certificate."""
    return ssl.create_default_context(cafile=ca_file)


def _dropped(sock: socket.socket) -> bool:
    """Whether an idle kept-alive SOCK was closed by its peer (or has bytes nobody asked for):
    then it is not used again."""
    if isinstance(sock, ssl.SSLSocket) and sock.pending():
        return True
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable)


def pool_for(
    target: Target, timeout: urllib3.Timeout, *, ca_certs: str | None = None
) -> urllib3.HTTPConnectionPool:
    """A one-connection pool to TARGET's checked address, never to what its name resolves to
    later: the name goes in TLS (SNI and the certificate check) and, from the caller, in the
    Host header. No retries."""
    if target.scheme == "https":
        return urllib3.HTTPSConnectionPool(
            target.address, target.port, timeout=timeout, retries=False, maxsize=1,
            server_hostname=target.host, assert_hostname=target.host,
            cert_reqs="CERT_REQUIRED", ca_certs=ca_certs,
        )  # fmt: skip
    return urllib3.HTTPConnectionPool(
        target.address, target.port, timeout=timeout, retries=False, maxsize=1
    )


def request(
    pool: urllib3.HTTPConnectionPool,
    method: str,
    target: Target,
    headers: dict[str, str],
    *,
    body: bytes | None = None,
) -> urllib3.BaseHTTPResponse:
    """Send METHOD to TARGET's path on POOL (``pool_for``) once, with HEADERS (the caller's
    Host header among them): no redirect followed, the answer left for the caller to read
    (as much of it as it wants) and release."""
    return pool.urlopen(
        method,
        target.path,
        body=body,
        headers=headers,
        redirect=False,
        retries=False,
        preload_content=False,
        assert_same_host=False,
    )


def post(url: str, body: str, headers: dict[str, str]) -> Answer:
    """POST BODY to URL once, on a connection of its own (``Connection``)."""
    with Connection(url) as connection:
        return connection.post(body, headers)
