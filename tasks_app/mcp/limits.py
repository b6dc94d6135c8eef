"""What one web process takes on, and the refusals that say "not now".

- **Slots.** Held work (a request that keeps its thread beyond a quick answer) takes a slot
  first: a synchronous tool or prompt run (and the thread of a streamed one), the wait of a
  keyed call without the tasks extension and the 2025-era ``tasks/cancel`` wait take one of
  ``sync_slots`` (``TASKDESK_SYNC_CONCURRENCY`` per process, ``TASKDESK_SYNC_PER_CLIENT``
  per client); held streams one of ``stream_slots`` (``TASKDESK_MAX_STREAMS``,
  ``TASKDESK_MAX_STREAMS_PER_CLIENT``). All of them together take at most
  ``TASKDESK_HELD_PER_PROCESS`` (``WEB_THREADS`` minus ``TASKDESK_RESERVED_THREADS``) of a
  process's threads, so quick requests always have threads of their own. A request that
  finds no slot is refused at once with ``busy`` (HTTP 429) instead of queueing. The
  per-client counts are leases in the shared cache (``client_slots``).
- **Refusals.** ``busy``, ``over_limit`` (a per-client quota or rate) and ``unavailable`` (the
  database, broker or cache cannot be reached) build ``RetryLater`` errors: JSON-RPC -32000
  with ``data.reason``, HTTP 429 or 503 and ``Retry-After``. Nothing was written when one is
  raised, so the same request, with the same idempotency key, may simply be sent again.
- **Outages.** ``outage(exc)`` tells an exception that means "a service we need is not
  answering" from a bug: only those become 503; a bug stays -32603.
- **Rates.** ``check_call_rate`` is a token bucket per client on ``tools/call``
  (``TASKDESK_CALL_RATE``), kept in the shared cache so that it holds across processes. A
  cache that cannot be reached lets the call through (logged): a rate limit must not turn a
  cache outage into an outage of the endpoint.
- **Disconnects.** ``disconnected(request)`` tells whether the client has closed its
  connection, so a synchronous run stops at its next checkpoint.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.core.signals import setting_changed
from django.dispatch import receiver

from tasks_app.mcp import client_slots
from tasks_app.mcp.errors import (
    McpError,
    RetryLater,
    from_code,
    is_outage,
    outage_types,
    unexpected,
)

log = logging.getLogger("tasks_app.mcp")

#: How long a client is told to wait after ``busy`` or an outage, in seconds.
BUSY_RETRY_SECONDS = 1
UNAVAILABLE_RETRY_SECONDS = 5


# --- refusals ---------------------------------------------------------------------------------


def busy(
    what: str = "synchronous calls",
    *,
    limit: int | None = None,
    setting: str = "TASKDESK_SYNC_CONCURRENCY",
    whose: str = "this server process is",
) -> RetryLater:
    """Held work refused: the process, or the client (WHOSE), already holds LIMIT of WHAT."""
    if limit is None:
        limit = settings.TASKDESK_SYNC_CONCURRENCY
    return RetryLater(
        f"Busy: {whose} already holding {limit} {what} ({setting}); retry shortly, "
        "or call the tool as a task and poll tasks/get",
        reason="busy",
        http_status=429,
        retry_after=BUSY_RETRY_SECONDS,
        data={"limit": limit},
    )


def cancelled() -> McpError:
    """The client closed the request of a synchronous run (the answer is rarely read)."""
    return from_code(
        -32000, "The call was cancelled: the client closed it", {"reason": "cancelled"}
    )


def time_up(
    seconds: float, *, can_be_task: bool, handshake: bool = False, by_key: bool = True
) -> McpError:
    """A synchronous run stopped at its time cap (a JSON-RPC error, HTTP 200). The advice
    names how this wire asks for a task: the tasks extension declared in the request
    (2026-07-28) or ``params.task`` (a 2025-11-25 HANDSHAKE session), or an idempotency key
    where a keyed call waits for a task (BY_KEY)."""
    if can_be_task:
        way = "with params.task" if handshake else "with the tasks extension declared"
        if by_key:
            way += ", or with an idempotency key,"
        how = f"call it again {way} so that it runs as a task"
    else:
        how = "this tool cannot run as a task here"
    return from_code(
        -32000,
        f"The call ran longer than the {seconds:g} s a synchronous call may take "
        f"(TASKDESK_SYNC_MAX_SECONDS) and was stopped; {how}",
        {"reason": "sync_time_limit", "limitSeconds": seconds},
    )


def over_limit(reason: str, message: str, *, retry_after: float, **data: Any) -> RetryLater:
    """A per-client quota or rate refused the call (HTTP 429)."""
    return RetryLater(
        message, reason=reason, http_status=429, retry_after=retry_after, data=data or None
    )


def unavailable(part: str) -> RetryLater:
    return RetryLater(
        f"Temporarily unavailable: the {part} is not answering. Nothing was recorded; send "
        "the same request again (with the same idempotency key) after Retry-After seconds",
        reason="temporarily_unavailable",
        http_status=503,
        retry_after=UNAVAILABLE_RETRY_SECONDS,
    )


def outage(exc: BaseException) -> RetryLater | None:
    """The 503 refusal for EXC if it means the database, broker or cache is unreachable (a
    connection refused, dropped or timed out); None for anything else, which is a bug."""
    database, services = outage_types()
    if isinstance(exc, RetryLater):
        return exc
    if isinstance(exc, database):
        log.warning("database unavailable: %s", str(exc).strip().splitlines()[:1])
        return unavailable("database")
    if isinstance(exc, services):
        log.warning("broker or cache unavailable: %s", exc)
        return unavailable("broker or cache")
    return None


def error_for(exc: BaseException) -> McpError:
    """The JSON-RPC error to answer for EXC: itself, an outage's 503, or a logged -32603."""
    if isinstance(exc, McpError):
        return exc
    return outage(exc) or unexpected(exc)


# --- rates ----------------------------------------------------------------------------------

_PERIODS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_rate(rate: str) -> tuple[int, int]:
    """``"10/second"`` -> (10, 1): COUNT calls per PERIOD seconds."""
    count, _, period = rate.partition("/")
    return int(count), _PERIODS[period.strip()[0]]


def take_token(key: str, rate: str, *, now: float | None = None) -> float:
    """Take one token from the bucket KEY that refills at RATE and holds at most its count
    (a burst of COUNT, then one every PERIOD/COUNT seconds). Return 0 when taken, else how
    many seconds until one is free.

    Kept as one number in the cache, the moment the bucket will be full again (GCRA, the
    generic cell rate algorithm). Read and written without a lock: clients racing on one
    key may each take the last token, which a rate limit can live with. (DRF's throttles
    keep a list of request times instead, and have no burst; this needs neither.)
    """
    count, period = parse_rate(rate)
    interval = period / count
    now = time.time() if now is None else now
    full_at = max(float(cache.get(key) or now), now)
    new_full_at = full_at + interval
    wait = new_full_at - count * interval - now
    if wait > 0:
        return wait
    cache.set(key, new_full_at, timeout=math.ceil(new_full_at - now) + 1)
    return 0.0


def check_call_rate(client_id: int) -> None:
    """Raise 429 ``call_rate`` when CLIENT_ID has used up its ``tools/call`` tokens."""
    rate = settings.TASKDESK_CALL_RATE
    if not rate:
        return
    try:
        wait = take_token(f"call-rate:{client_id}", rate)
    except Exception as exc:
        if not is_outage(exc):
            raise
        log.warning("call rate not counted (cache unavailable): %s", exc)
        return
    if wait:
        raise over_limit(
            "call_rate",
            f"Calling too fast: this client may make {rate} tools/call requests "
            "(TASKDESK_CALL_RATE); wait Retry-After seconds",
            retry_after=wait,
            rate=rate,
        )


def poll_rate(wait: float | None) -> RetryLater:
    """``tasks/get`` polled faster than ``TASKDESK_POLL_THROTTLE``."""
    return over_limit(
        "poll_rate",
        f"Polling too fast: wait {max(1, math.ceil(wait or 1))} s (honour pollIntervalMs)",
        retry_after=wait or 1,
    )


# --- slots ------------------------------------------------------------------------------------


class Slots:
    """A per-process count of concurrent runs, taken without waiting."""

    def __init__(self, size: Callable[[], int]) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._used = 0

    @property
    def used(self) -> int:
        return self._used

    @property
    def size(self) -> int:
        return self._size()

    def try_take(self) -> bool:
        with self._lock:
            if self._used >= self._size():
                return False
            self._used += 1
            return True

    def give_back(self) -> None:
        with self._lock:
            self._used = max(0, self._used - 1)


#: Every held request of this process, whatever its kind: at most ``WEB_THREADS`` minus
#: ``TASKDESK_RESERVED_THREADS``, so quick requests always have threads of their own.
held_slots = Slots(lambda: settings.TASKDESK_HELD_PER_PROCESS)


class HeldWork(Slots):
    """One kind of held work: a per-process count of its own (within ``held_slots``) and a
    per-client count across processes (``client_slots``), all taken without waiting."""

    def __init__(
        self,
        kind: str,
        size: Callable[[], int],
        setting: str,
        per_client: Callable[[], int],
        per_client_setting: str,
        what: str,
    ) -> None:
        super().__init__(size)
        self.kind = kind
        self.setting = setting
        self.per_client = per_client
        self.per_client_setting = per_client_setting
        self.what = what

    def take(self, what: str | None = None, client: int | None = None) -> Callable[[], None]:
        """Take a slot (and one of CLIENT's, when given) or raise ``busy``; return the
        function that gives it back (once)."""
        what = what or self.what
        if not self.try_take():
            raise busy(what, limit=self.size, setting=self.setting)
        if not held_slots.try_take():
            self.give_back()
            raise busy(
                "held requests (streams, synchronous runs and waits)",
                limit=held_slots.size,
                setting="WEB_THREADS - TASKDESK_RESERVED_THREADS",
            )
        lease: client_slots.Lease | None = None
        if client is not None:
            try:
                lease = client_slots.take(self.kind, client, self.per_client())
            except BaseException:
                held_slots.give_back()
                self.give_back()
                raise
            if lease is None:
                held_slots.give_back()
                self.give_back()
                raise busy(
                    what,
                    limit=self.per_client(),
                    setting=self.per_client_setting,
                    whose="this client is",
                )
        given = threading.Event()

        def release() -> None:
            if not given.is_set():
                given.set()
                if lease is not None:
                    lease.close()
                held_slots.give_back()
                self.give_back()

        return release

    @contextlib.contextmanager
    def held(self, what: str | None = None, client: int | None = None) -> Iterator[None]:
        release = self.take(what, client)
        try:
            yield
        finally:
            release()


#: Synchronous tool and prompt runs (streamed or not), the waits of keyed calls without the
#: tasks extension and the 2025-era ``tasks/cancel`` wait.
sync_slots = HeldWork(
    "sync",
    lambda: settings.TASKDESK_SYNC_CONCURRENCY,
    "TASKDESK_SYNC_CONCURRENCY",
    lambda: settings.TASKDESK_SYNC_PER_CLIENT,
    "TASKDESK_SYNC_PER_CLIENT",
    "synchronous calls",
)
#: Held streams: the 2025 ``GET`` stream and blocking ``tasks/result`` (``stream_slots``).
stream_slots = HeldWork(
    "stream",
    lambda: settings.TASKDESK_MAX_STREAMS,
    "TASKDESK_MAX_STREAMS",
    lambda: settings.TASKDESK_MAX_STREAMS_PER_CLIENT,
    "TASKDESK_MAX_STREAMS_PER_CLIENT",
    "open streams",
)


@receiver(setting_changed)
def _reset_slots(*, setting: str, **kwargs: Any) -> None:
    if setting == "TASKDESK_SYNC_CONCURRENCY":
        sync_slots._used = 0
    if setting == "TASKDESK_MAX_STREAMS":
        stream_slots._used = 0
    if setting in {
        "TASKDESK_SYNC_CONCURRENCY",
        "TASKDESK_MAX_STREAMS",
        "TASKDESK_HELD_PER_PROCESS",
    }:
        held_slots._used = sync_slots._used + stream_slots._used


# --- disconnects ------------------------------------------------------------------------------


def disconnected(request: Any) -> Callable[[], bool]:
    """A check that answers True once the client has closed the connection of REQUEST.

    Gunicorn hands the client socket to the application (``gunicorn.socket``); a peek that
    reads end-of-file means the client has gone. Without a socket (other servers, the test
    client) the check always answers False.
    """
    meta = getattr(request, "META", {})
    sock = meta.get("gunicorn.socket")
    if not isinstance(sock, socket.socket):
        return lambda: False

    def check() -> bool:
        try:
            return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False  # nothing to read: the client is waiting for its answer
        except ValueError:
            return False  # a TLS socket cannot be peeked at
        except OSError as exc:
            return exc.errno in {errno.ECONNRESET, errno.EPIPE, errno.EBADF, errno.ENOTCONN}

    return check
