"""Broker transports: the embedded one (kombu's filesystem transport, made safe for concurrent
processes), and kombu's Redis transport with one Redis client per channel.

The embedded broker
-------------------

kombu's own transport creates a message file and then writes into it, so a worker polling the
folder can pick the file up while it is still empty and die on the JSON decode. Here a message
is written under a temporary name the reader ignores and then renamed into place (a rename is
atomic within one filesystem), and a reader claims a message by renaming it into a folder on
the same filesystem, so two readers can never both take it and nothing is copied across
filesystems. The exchange tables (which queues are bound to an exchange) are locked before
they are read or written, so processes that start at once cannot write over each other.

A claimed message stays in the claimed folder, named after the process that claimed it, until
that process acknowledges it (or rejects it, or gives it back at a clean shutdown). A process
killed with messages it had claimed (prefetched, or running with late acknowledgement)
leaves their files behind; the next process that opens a channel on the folder (a worker
starting again, any other) puts every message of a dead claimer back in its queue, so it is
delivered again at once instead of being lost.

The transport is also polled from the worker's event loop. Celery runs a prefork worker on a
transport without one in its blocking loop, whose pool processes share one job pipe: a process
waiting for its next job holds the pipe's lock while it waits, so one killed then (SIGKILL, the
OOM killer) leaves the lock held for good and no pool process ever gets a job again. With the
event loop the worker gives each pool process its own pipes, as it does on Redis.

Redis
-----
kombu's Redis channel builds a new ``redis.Redis`` client for every synchronous command it
sends: every publish, and every acknowledgement in a worker. Building one fills its table of
response callbacks anew (a few hundred entries), which cost more CPU than the command itself:
about a third of a ``tools/call``'s publish, and as much in the worker's main process per
acknowledged job. ``RedisChannel`` builds that client once per channel and keeps it; a
``redis.Redis`` client is safe to share between threads (each command takes a connection from
the channel's pool), and a channel whose connection fails is replaced by kombu, client and all.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import uuid
from functools import cache
from pathlib import Path
from queue import Empty
from time import monotonic
from typing import Any, cast

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.transport import redis as kombu_redis
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

CLAIMED = "claimed"


@cache
def _start_time(pid: int) -> str:
    """When process PID started (clock ticks since boot; Linux), "" where it cannot be read:
    with the pid, it names a process even after its pid is reused."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read().decode(errors="replace")
    except OSError:
        return ""
    return stat.rpartition(")")[2].split()[19]


def _claimer() -> str:
    pid = os.getpid()
    return f"{pid}.{_start_time(pid)}"


def _alive(claimer: str) -> bool:
    pid_text, _, started = claimer.partition(".")
    try:
        pid = int(pid_text)
        os.kill(pid, 0)
    except ValueError:
        return False
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if not started:
        return True
    _start_time.cache_clear()
    return _start_time(pid) == started


class Channel(filesystem.Channel):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._claimed_files: dict[str, str] = {}
        self._no_ack_queues: set[str] = set()  # consumed without acknowledgements
        self._restore_orphans()

    @property
    def _claimed_dir(self) -> str:
        folder = os.path.join(os.path.dirname(self.data_folder_in.rstrip("/")), CLAIMED)
        os.makedirs(folder, exist_ok=True)
        return folder

    def _restore_orphans(self) -> int:
        """Put the messages claimed by processes that are gone back in their queues."""
        restored = 0
        claimed_dir = self._claimed_dir
        for name in sorted(os.listdir(claimed_dir)):
            claimer, sep, original = name.partition("~")
            if not sep or _alive(claimer):
                continue
            with contextlib.suppress(FileNotFoundError):  # another process restored it
                os.rename(
                    os.path.join(claimed_dir, name), os.path.join(self.data_folder_in, original)
                )
                restored += 1
        return restored

    def _settled(self, delivery_tag: Any) -> None:
        path = self._claimed_files.pop(str(delivery_tag), None)
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def basic_consume(self, queue: str, no_ack: bool, *args: Any, **kwargs: Any) -> Any:
        if no_ack:
            self._no_ack_queues.add(queue)
        return super().basic_consume(queue, no_ack, *args, **kwargs)

    def basic_get(self, queue: str, no_ack: bool = False, **kwargs: Any) -> Any:
        if not no_ack:
            return super().basic_get(queue, no_ack=no_ack, **kwargs)
        self._no_ack_queues.add(queue)
        try:
            return super().basic_get(queue, no_ack=no_ack, **kwargs)
        finally:
            self._no_ack_queues.discard(queue)

    def basic_ack(self, delivery_tag: Any, multiple: bool = False) -> None:
        super().basic_ack(delivery_tag, multiple=multiple)
        self._settled(delivery_tag)

    def basic_reject(self, delivery_tag: Any, requeue: bool = False) -> None:
        super().basic_reject(delivery_tag, requeue=requeue)  # requeue: _restore puts it back
        self._settled(delivery_tag)

    def _restore(self, message: Any) -> None:
        super()._restore(message)  # a fresh copy in the queue
        self._settled(message.delivery_tag)

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
        claimed_dir = self._claimed_dir
        for name in sorted(os.listdir(self.data_folder_in)):
            if name.partition(".")[2] != wanted:
                continue
            claimed = os.path.join(claimed_dir, f"{_claimer()}~{name}")
            try:
                os.rename(os.path.join(self.data_folder_in, name), claimed)
            except FileNotFoundError:
                continue  # another reader claimed it first
            with open(claimed, "rb") as handle:
                payload = loads(bytes_to_str(handle.read()))
            tag = (payload.get("properties") or {}).get("delivery_tag")
            if tag is None or queue in self._no_ack_queues:
                os.unlink(claimed)  # nobody will acknowledge it: done once delivered
            else:
                self._claimed_files[str(tag)] = claimed
            return payload
        raise Empty()

    # An exchange's table (the queues bound to it) is a JSON file. kombu's bind opened a
    # missing one with "wb" and only then locked it: two processes binding at once on a new
    # folder (the leg worker and the control worker, as `make run` starts them) both
    # truncated it and wrote their lists over each other, the shorter list over the longer
    # one's start, and the next process to read the table died on the JSON. Here a binder
    # creates the file without truncating it, locks it, and only then reads, adds and
    # rewrites it whole; a reader takes a file created but not yet written as an empty table.
    def get_table(self, exchange: str) -> list[Any]:
        path = self._table_path(exchange)
        try:
            with open(path, "rb") as handle:
                fcntl.flock(handle, fcntl.LOCK_SH)  # released when closed
                raw = handle.read()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise ChannelError(f"Cannot open {path}") from exc
        return _table(raw)

    def _queue_bind(
        self, exchange: str, routing_key: str | None, pattern: str | None, queue: str | None
    ) -> None:
        path = self._table_path(exchange)
        self.control_folder.mkdir(exist_ok=True)
        entry = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise ChannelError(f"Cannot open {path}") from exc
        with os.fdopen(fd, "rb+", buffering=0) as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)  # released when closed
            table = _table(handle.read())
            if entry not in table:
                table.insert(0, entry)
                handle.seek(0)
                handle.truncate()
                handle.write(str_to_bytes(dumps(table)))

    def _table_path(self, exchange: str) -> Path:
        # kombu's own path, which also refuses an exchange name unfit for a file name.
        return cast(Path, cast(Any, self)._exchange_file(exchange))


def _table(raw: bytes) -> list[Any]:
    """An exchange table's entries; an empty file (created, not yet written) is none."""
    if not raw.strip():
        return []
    return [filesystem.exchange_queue_t(*entry) for entry in loads(bytes_to_str(raw))]


class Transport(filesystem.Transport):
    Channel = Channel
    implements = filesystem.Transport.implements.extend(asynchronous=True)
    # A folder has no host: without this, kombu's default ("localhost") made every process
    # warn "No hostname was supplied" at start.
    default_connection_params: dict[str, Any] = {}

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


class RedisChannel(kombu_redis.Channel):
    """kombu's Redis channel, with one client for its synchronous commands (module docstring)."""

    _sync_client: Any = None

    @contextlib.contextmanager
    def conn_or_acquire(self, client: Any = None) -> Any:
        if client:
            yield client
            return
        if self._sync_client is None:
            self._sync_client = self._create_client()  # type: ignore[attr-defined]
        yield self._sync_client


class RedisTransport(kombu_redis.Transport):
    Channel = RedisChannel
