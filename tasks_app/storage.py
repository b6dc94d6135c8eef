"""The bytes each client's kept tasks hold, and the quota on them
(``TASKDESK_MAX_STORED_BYTES_PER_CLIENT``).

Each task counts its own bytes in ``Task.stored_bytes``, as compact JSON (text as UTF-8):
its arguments, written by the statement that accepts it; the answers to its questions, added
when one is recorded (``elicitations.transitions``: the answer and its event's copy); and its
result, error and status message, added by the statement that ends it (``transitions``).
Not counted: a status message of a task that has not ended (progress, a question's prompt;
at most 2,000 characters, replaced when the task ends), the questions themselves, and the
timeline's other events (small, of a bounded shape). A client's figure is the sum over its
tasks; the purge deletes tasks, and so lowers it.

The figure is not kept on the client row. A counter there, updated by every accept and
every leg end of the client, would be one row all of a client's concurrent calls lock and
rewrite (a new row version each time, on the hottest statements). Instead it is **counted
again from the task table at most every** ``TASKDESK_STORED_BYTES_RECOUNT_SECONDS`` per
client, kept in the shared cache for that long, and each web process trusts what it read for
``MEMO_SECONDS`` more, adding the arguments it accepted itself. An accept therefore costs no
lock and, most of the time, no round trip at all. A count reads every kept task of the
client, once per client per recount period for all the processes together, in the request
that found no figure (one ``sum``; its cost grows with the client's kept tasks, and no
benchmark of it is recorded). The purge forgets the figures of the clients it purged, so freed room is seen at
once.

The price is slack: the check is eventually consistent. A client can pass its quota by what
it stores within one recount period before the figure shows it: results written by the
workers meanwhile (each at most ``TASKDESK_MAX_RESULT_BYTES``), and the arguments other web
processes accepted (each at most ``TASKDESK_MAX_ARGUMENT_BYTES``). ``TASKDESK_CALL_RATE``
bounds how many tasks that can be. A replay of a key the client already used is never
refused: it stores nothing. A cache that cannot be reached lets the call through (logged),
as the call rate does.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.core.signals import setting_changed
from django.db import InterfaceError, OperationalError
from django.db.models import Sum
from django.dispatch import receiver

from tasks_app.models import Task

log = logging.getLogger(__name__)

#: How long a web process trusts a figure it read from the shared cache, in seconds.
MEMO_SECONDS = 1.0


# --- sizes -----------------------------------------------------------------------------------


def json_bytes(value: Any) -> int:
    """How many bytes VALUE takes as compact JSON (0 for None: nothing is kept)."""
    if value is None:
        return 0
    return len(json.dumps(value, separators=(",", ":"), default=str).encode())


def ended_bytes(fields: dict[str, Any]) -> int:
    """The bytes the end of a task adds, from the FIELDS it writes (result, error, status
    message)."""
    return (
        json_bytes(fields.get("result"))
        + json_bytes(fields.get("error"))
        + len(str(fields.get("status_message") or "").encode())
    )


# --- the per-client figure ---------------------------------------------------------------------


def _key(client_id: int) -> str:
    return f"stored-bytes:{client_id}"


def count(client_id: int) -> int:
    """The bytes CLIENT_ID's kept tasks hold, counted from the task table now."""
    total = Task.objects.filter(client_id=client_id).aggregate(total=Sum("stored_bytes"))["total"]
    return int(total or 0)


class _Memo:
    """What this process last read of each client's figure (the figure, when it was counted,
    when it was read) and the arguments it accepted for the client since.

    Its own accepts are kept until a figure counted after them is read, so a process never
    forgets what it accepted itself because the memo or the cached figure aged."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._read: dict[int, tuple[float, int, float]] = {}
        # Per client: its accepts (time, size) in time order, and their total.
        self._own: dict[int, tuple[deque[tuple[float, int]], list[int]]] = {}

    def get(self, client_id: int) -> int | None:
        with self._lock:
            read = self._read.get(client_id)
            if read is None or time.monotonic() - read[0] > MEMO_SECONDS:
                return None
            own = self._own.get(client_id)
            return read[1] + (own[1][0] if own else 0)

    def put(self, client_id: int, figure: int, counted_at: float) -> int:
        """Note FIGURE, counted at COUNTED_AT (``time.time()``); return it with this
        process's accepts made after that count."""
        with self._lock:
            if len(self._read) > 10_000:
                self._read.clear()  # clients come and go; never grow without bound
                self._own.clear()
            self._read[client_id] = (time.monotonic(), figure, counted_at)
            own = self._own.get(client_id)
            if own is None:
                return figure
            accepts, total = own
            while accepts and accepts[0][0] <= counted_at:  # in that count already
                total[0] -= accepts.popleft()[1]
            return figure + total[0]

    def add(self, client_id: int, size: int) -> None:
        with self._lock:
            if client_id in self._read:  # a client whose figure this process checks
                accepts, total = self._own.setdefault(client_id, (deque(), [0]))
                accepts.append((time.time(), size))
                total[0] += size

    def forget(self, client_ids: Iterable[int]) -> None:
        with self._lock:
            for client_id in client_ids:
                self._read.pop(client_id, None)

    def clear(self) -> None:
        with self._lock:
            self._read.clear()
            self._own.clear()


_memo = _Memo()


def _cache_outage(exc: BaseException) -> bool:
    import redis.exceptions

    return isinstance(
        exc, ConnectionError | OperationalError | InterfaceError | redis.exceptions.ConnectionError
        | redis.exceptions.TimeoutError,
    )  # fmt: skip


def stored_bytes(client_id: int) -> int | None:
    """CLIENT_ID's figure as this process sees it (see the module's note on slack): from its
    memo, else the shared cache, else counted now and cached for the recount period; plus
    the arguments this process accepted since that count. None when the cache cannot be
    reached (the quota is not checked then)."""
    figure = _memo.get(client_id)
    if figure is not None:
        return figure
    try:
        cached = cache.get(_key(client_id))
        if cached is None:
            counted_at = time.time()
            cached = (count(client_id), counted_at)
            timeout = settings.TASKDESK_STORED_BYTES_RECOUNT_SECONDS
            cache.set(_key(client_id), cached, timeout=timeout)
    except Exception as exc:
        if not _cache_outage(exc):
            raise
        log.warning("stored bytes not counted (cache or database unavailable): %s", exc)
        # Not tried again for MEMO_SECONDS: meanwhile this process sees its own accepts only.
        _memo.put(client_id, 0, float("-inf"))
        return None
    counted, counted_at = cached
    return _memo.put(client_id, int(counted), float(counted_at))


def over_quota(client_id: int) -> tuple[int, int] | None:
    """(figure, limit) when CLIENT_ID's kept tasks hold the quota or more; else None."""
    limit = settings.TASKDESK_MAX_STORED_BYTES_PER_CLIENT
    if not limit:
        return None
    figure = stored_bytes(client_id)
    if figure is None or figure < limit:
        return None
    return figure, limit


def accepted(client_id: int, size: int) -> None:
    """This process accepted SIZE bytes of arguments for CLIENT_ID: its memo shows them."""
    _memo.add(client_id, size)


def forget(client_ids: Iterable[int]) -> None:
    """Drop the figures of CLIENT_IDS (the purge freed room): the next check counts again."""
    ids = set(client_ids)
    if not ids:
        return
    _memo.forget(ids)
    try:
        cache.delete_many([_key(client_id) for client_id in ids])
    except Exception as exc:
        if not _cache_outage(exc):
            raise
        log.warning("stored bytes not forgotten (cache unavailable): %s", exc)


@receiver(setting_changed)
def _reset(*, setting: str, **kwargs: Any) -> None:
    if setting in {
        "CACHES",
        "TASKDESK_MAX_STORED_BYTES_PER_CLIENT",
        "TASKDESK_STORED_BYTES_RECOUNT_SECONDS",
    }:
        _memo.clear()
