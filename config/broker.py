"""The embedded broker: kombu's filesystem transport, made safe for concurrent processes.

kombu's own transport creates a message file and then writes into it, so a worker polling the
folder can pick the file up while it is still empty and die on the JSON decode. Here a message
is written under a temporary name the reader ignores and then renamed into place (a rename is
atomic within one filesystem), and a reader claims a message by renaming it into a folder on
the same filesystem, so two readers can never both take it and nothing is copied across
filesystems.

The transport is also polled from the worker's event loop. Celery runs a prefork worker on a
transport without one in its blocking loop, whose pool processes share one job pipe: a process
waiting for its next job holds the pipe's lock while it waits, so one killed then (SIGKILL, the
OOM killer) leaves the lock held for good and no pool process ever gets a job again. With the
event loop the worker gives each pool process its own pipes, as it does on Redis.
"""

from __future__ import annotations

import os
import uuid
from queue import Empty
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads


class Channel(filesystem.Channel):
    # kombu's filesystem.Channel signature, which its stubs also mark as differing from the
    # base AbstractChannel's (payload, not message); kombu passes it positionally.
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        folder = self.data_folder_out
        final = os.path.join(folder, f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg")
        # No ".<queue>.msg" suffix: _get skips the file until the rename completes.
        temp = os.path.join(folder, f"incoming-{uuid.uuid4()}")
        try:
            with open(temp, "wb") as handle:
                handle.write(str_to_bytes(dumps(payload)))
            os.replace(temp, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add a message to {folder!r}") from exc

    def _get(self, queue: str, timeout: float | None = None) -> Any:  # timeout: never waits
        wanted = f"{queue}.msg"
        claimed_dir = os.path.join(os.path.dirname(self.data_folder_in.rstrip("/")), "claimed")
        os.makedirs(claimed_dir, exist_ok=True)
        for name in sorted(os.listdir(self.data_folder_in)):
            if name.partition(".")[2] != wanted:
                continue
            claimed = os.path.join(claimed_dir, name)
            try:
                os.rename(os.path.join(self.data_folder_in, name), claimed)
            except FileNotFoundError:
                continue  # another reader claimed it first
            try:
                with open(claimed, "rb") as handle:
                    payload = handle.read()
            finally:
                os.unlink(claimed)
            return loads(bytes_to_str(payload))
        raise Empty()


class Transport(filesystem.Transport):
    Channel = Channel
    implements = filesystem.Transport.implements.extend(asynchronous=True)

    def register_with_event_loop(self, connection: Any, loop: Any) -> None:
        loop.call_repeatedly(self.polling_interval, self._deliver_ready)

    def _deliver_ready(self) -> None:
        """Deliver every message the consumers can take now (as many as QoS allows)."""
        assert self.cycle is not None  # set in virtual.Transport.__init__
        while True:
            try:
                self.cycle.get(self._deliver)
            except Empty:
                return
