"""Per-client counts of held work across web processes, as leases in the shared cache.

A client may hold at most N requests of one kind (``sync`` or ``stream``) at once, whichever
web process serves them. Its slots are N cache keys, ``held:<kind>:<client>:<i>``; a request
takes the first free one with ``cache.add`` (atomic in Redis and in the database cache) and
deletes it when it ends. Each key expires after ``LEASE_SECONDS`` unless renewed: a thread of
every web process renews the leases it holds every ``RENEW_SECONDS``. A process that is
killed renews nothing, so the slots it held are free again within ``LEASE_SECONDS``; they
never leak.

A cache that cannot be reached lets the request through (logged), as the call rate does:
the per-process bounds still hold, and a limit must not turn a cache outage into an outage
of the endpoint.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading

from django.core.cache import cache

from tasks_app.mcp.errors import RetryLater, is_outage

log = logging.getLogger("tasks_app.mcp")

#: How long a slot stays taken without being renewed (what a killed process costs).
LEASE_SECONDS = 30
RENEW_SECONDS = 10

_lock = threading.Lock()
_leases: dict[str, str] = {}  # key -> token, the leases this process holds
_renewer_pid: int | None = None


class Lease:
    def __init__(self, key: str | None, token: str) -> None:
        self.key = key
        self.token = token
        self._open = True

    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        if self.key is None:
            return
        with _lock:
            if _leases.get(self.key) == self.token:  # not a later holder's, after this ran out
                del _leases[self.key]
        try:
            if cache.get(self.key) == self.token:
                cache.delete(self.key)
        except Exception as exc:
            if not _outage(exc):
                raise
            log.warning("held slot %s not given back (cache unavailable): %s", self.key, exc)


def take(kind: str, client: int, limit: int) -> Lease | None:
    """One of CLIENT's LIMIT slots of KIND, or None when all are taken."""
    token = f"{os.getpid()}:{secrets.token_hex(8)}"
    keys = [f"held:{kind}:{client}:{index}" for index in range(limit)]
    # The slots this process holds itself are tried last: a client with several held
    # requests here finds a free slot with one round trip, not one per slot it holds.
    with _lock:
        order = sorted(keys, key=lambda key: key in _leases)
    try:
        for key in order:
            if cache.add(key, token, timeout=LEASE_SECONDS):
                with _lock:
                    _leases[key] = token
                _ensure_renewer()
                return Lease(key, token)
        # The database cache answers a failed write (a locked SQLite) as "already there":
        # only slots that are really taken refuse.
        if len(cache.get_many(keys)) >= limit:
            return None
        log.warning("held %s of client %s not counted (the cache refused a write)", kind, client)
    except Exception as exc:
        if not _outage(exc):
            raise
        log.warning("held %s of client %s not counted (cache unavailable): %s", kind, client, exc)
    return Lease(None, token)


def taken(kind: str, client: int, limit: int) -> int:
    """How many of CLIENT's first LIMIT slots of KIND are taken (for tests and the shell)."""
    keys = [f"held:{kind}:{client}:{index}" for index in range(limit)]
    return len(cache.get_many(keys))


def renew() -> None:
    """Extend every lease this process holds (a lease another holder took meanwhile, after
    it had run out, is left alone: it is theirs now)."""
    with _lock:
        held = dict(_leases)
    for key, token in held.items():
        try:
            if cache.get(key) == token:
                cache.touch(key, LEASE_SECONDS)
        except Exception as exc:
            if not _outage(exc):
                log.exception("renewing held slot %s failed", key)
            else:
                log.warning("held slot %s not renewed (cache unavailable): %s", key, exc)


def _ensure_renewer() -> None:
    global _renewer_pid
    with _lock:
        if _renewer_pid == os.getpid():
            return
        _renewer_pid = os.getpid()
    threading.Thread(target=_renew_forever, name="held-slot-leases", daemon=True).start()


def _renew_forever() -> None:
    from django.db import connections

    stop = threading.Event()
    while not stop.wait(RENEW_SECONDS):
        renew()
        connections.close_all()  # the database cache's connection, if that is the cache


def _outage(exc: BaseException) -> bool:
    return isinstance(exc, RetryLater) or is_outage(exc)
