"""A local SMTP server for the tests (aiosmtpd): it keeps every message it receives."""

from __future__ import annotations

import email
import socket
import threading
from dataclasses import dataclass
from email.message import Message
from typing import Any

from aiosmtpd.controller import Controller


def _free_port() -> int:
    # aiosmtpd's controller checks the server by connecting to its port: it needs a real one.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Received:
    to: list[str]
    message: Message

    @property
    def subject(self) -> str:
        return str(self.message["Subject"])

    @property
    def text(self) -> str:
        payload = self.message.get_payload(decode=True)
        assert isinstance(payload, bytes)
        return payload.decode()


class MailServer:
    """An SMTP server on a free loopback port; ``received`` holds what it was sent.
    ``refuse`` makes it answer every message with a temporary failure (451)."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self.refuse = False
        self._lock = threading.Lock()
        self.port = _free_port()
        self.controller = Controller(self, hostname="127.0.0.1", port=self.port)
        self.controller.start()
        self.url = f"smtp://127.0.0.1:{self.port}"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        if self.refuse:
            return "451 Try again later"
        message = email.message_from_bytes(envelope.content)
        with self._lock:
            self.received.append(Received(list(envelope.rcpt_tos), message))
        return "250 OK"

    def to(self, address: str) -> list[Received]:
        with self._lock:
            return [r for r in self.received if address in r.to]

    def close(self) -> None:
        self.controller.stop()
