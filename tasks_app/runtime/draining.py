"""Draining: a worker process running waiting tasks straight from their dispatch records.

After its own leg a ``run_task_job`` runs ``run_waiting_legs`` for up to
``TASKDESK_WAITING_LEGS_SECONDS``. Meanwhile the process is a drainer (``models.Drainer``):

- Each look for the next record (``leases.claim_next``) says, in the same statement, that
  the process will look again within ``TASKDESK_DRAIN_WINDOW_SECONDS``. While such a row is
  fresh, web processes leave new records to it instead of publishing a message
  (``dispatch``). On PostgreSQL the statement that ends a leg makes the next look too
  (``leases.look_after_end``): one statement per leg while records are waiting.
- When nothing is waiting, the process stands by (PostgreSQL): it LISTENs on a channel of
  its own and marks its row ``standby`` (in the statement of the look that found nothing);
  a web process hands it the next new record (one statement that clears the mark and
  notifies the channel), and it runs that leg at once.
- It stops by deleting its row and then looking once more (from ``leases._Floor``'s low
  bound): a record committed before any web process read the row is seen by that look, so
  nothing left to the process is ever stranded. If its time runs out with records still
  waiting, it sends one wake-up message (``dispatch.wake``) and the next job goes on.
- A record that waited longer than ``TASKDESK_DRAIN_RECRUIT_SECONDS`` makes it ask, at most
  once a second, for another worker process (a wake-up message that any idle one takes):
  the drainers are falling behind.
- A leg that outlasts the window publishes what was left to the process (the lease
  renewer, ``leases._Renewer``); the sweeper publishes what a killed drainer left once no
  drainer is fresh.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
import uuid
import weakref
from typing import Any

import psycopg
from django.conf import settings
from django.db import connection
from django.utils import timezone

from tasks_app import db, dispatch
from tasks_app.runtime import leases, legs

log = logging.getLogger("tasks_app.runtime")

# Standing by for less than this is not worth the two statements it takes.
MIN_STANDBY_SECONDS = 0.05


def run_waiting_legs(*, seconds: float) -> int:
    """Run legs of waiting tasks (dispatch records no leg consumed yet) one after another,
    for up to SECONDS, without waiting for their messages; stand by for new ones while
    nothing waits. Return how many legs ran.

    A leg already begun always finishes; SECONDS only stops taking new ones.
    """
    deadline = time.monotonic() + seconds
    name = drainer_name()
    ran = 0
    draining = False
    # The look the last leg's end made in its own statement (leases.look_after_end), if any.
    look: db.LookAfterEnd | None = None
    try:
        while True:
            if look is not None and look.looked is not None:
                owner, sent, looked = look.owner, look.sent, look.looked
            else:
                if time.monotonic() >= deadline:
                    draining = _leave(name)
                    if leases.waiting():
                        dispatch.wake("waiting legs handed on")
                    break
                owner = leases.new_owner()
                sent = time.monotonic()
                looked = leases.look(
                    owner=owner, drainer=name, standby=_standby_seconds(deadline),
                    channel=_channel(),
                )  # fmt: skip
            found, look = looked.taken, None
            draining = True
            if found is None:
                found = _stand_by(name, owner, deadline, marked=looked.standing_by)
            if found is None:
                # Leave, then look once more: a record that a web process left to this one
                # after reading its row is committed by now.
                draining = _leave(name)
                found = leases.claim_next(owner=owner, thorough=True)
                if found is None:
                    break  # nothing is waiting
            _recruit_if_behind(found)
            if found.claim is not None:
                can_stand_by = _standby_seconds(deadline) > 0
                with leases.look_after_end(
                    found.claim.task.pk, drainer=name, deadline=deadline,
                    channel=_channel() if can_stand_by else "", min_standby=MIN_STANDBY_SECONDS,
                ) as look:  # fmt: skip
                    legs.run_claimed(found.claim, owner, found.dispatch_id, sent, drained=draining)
                ran += 1
    finally:
        if draining:
            _leave(name)
    return ran


_names: dict[int, tuple[str, str]] = {}
_recruited = 0.0


def drainer_name() -> str:
    """This process's name as a drainer (host, pid and a random part: a pid is reused)."""
    return _identity()[0]


def _channel() -> str:
    """This process's LISTEN channel (an identifier of its own, under 63 bytes)."""
    return _identity()[1]


def _identity() -> tuple[str, str]:
    pid = os.getpid()
    found = _names.get(pid)
    if found is None:
        _names.clear()
        suffix = uuid.uuid4().hex
        found = _names[pid] = (f"{socket.gethostname()}:{pid}:{suffix[:8]}", f"taskdesk_{suffix}")
    return found


def _leave(name: str) -> bool:
    """Delete this process's drainer row; False (no longer draining)."""
    db.backend().withdraw(name)
    return False


def _recruit_if_behind(found: db.Next) -> None:
    global _recruited
    if found.created_at is None:
        return
    waited = (timezone.now() - found.created_at).total_seconds()
    now = time.monotonic()
    if waited > settings.TASKDESK_DRAIN_RECRUIT_SECONDS and now - _recruited > 1.0:
        _recruited = now
        dispatch.wake(f"a waiting record waited {waited:.1f} s")


# --- standing by (PostgreSQL) -----------------------------------------------------------------

# The connections that LISTEN on this process's channel (a new connection must LISTEN again).
_listening: weakref.WeakKeyDictionary[psycopg.Connection[Any], str] = weakref.WeakKeyDictionary()


def _standby_seconds(deadline: float) -> float:
    """How long this process would stand by if its next look found nothing (0: it would
    not). Where it would, it LISTENs on its channel from now on, so that a look may mark it
    standing by in its own statement."""
    remaining = deadline - time.monotonic()
    if (
        not settings.TASKDESK_DRAIN_STANDBY
        or not db.backend().can_stand_by
        or remaining < MIN_STANDBY_SECONDS
    ):
        return 0.0
    _listen()
    return remaining


def _stand_by(name: str, owner: str, deadline: float, *, marked: bool) -> db.Next | None:
    """Wait until DEADLINE for a web process to hand this process a new record; return what
    it took, or None (nothing came, or the database cannot hand records over). MARKED: the
    look that found nothing marked this process standing by already."""
    remaining = _standby_seconds(deadline)
    if not remaining:
        return None
    raw = _listen()
    if not marked:
        db.backend().stand_by(name, channel=_channel(), seconds=remaining)
    # Hand-offs that arrived while this process was busy, and any since the mark: the look
    # below takes their records (each was committed before its hand-off).
    for _stale in raw.notifies(timeout=0):
        pass
    # A record committed after the last look began and before its mark committed was handed
    # to nobody.
    found = leases.claim_next(owner=owner, thorough=True)
    if found is not None:
        return found
    record = _handed_over(raw, deadline)
    if record is None:
        return None
    dispatch_id, task_id = record
    # None: another drainer's look took the record first, or its task cannot start.
    claim = leases.claim(task_id=task_id, dispatch_id=dispatch_id, owner=owner)
    return db.Next(dispatch_id, claim, None)


def _handed_over(raw: psycopg.Connection[Any], deadline: float) -> dispatch.Pending | None:
    """The first record handed to this process before DEADLINE, or None."""
    while (remaining := deadline - time.monotonic()) > 0:
        # The generator holds the connection's lock until it is closed: close it before the
        # connection is used again.
        with contextlib.closing(raw.notifies(timeout=remaining, stop_after=1)) as notes:
            note = next(notes, None)
        if note is None:
            return None  # the time is up
        record = dispatch.parse_handoff(note.payload)
        if record is not None:
            return record
    return None


def _listen() -> psycopg.Connection[Any]:
    """This process's database connection, listening on its channel."""
    connection.ensure_connection()
    raw: psycopg.Connection[Any] = connection.connection
    channel = _channel()
    if _listening.get(raw) != channel:
        raw.execute(f'LISTEN "{channel}"')
        _listening[raw] = channel
    return raw
