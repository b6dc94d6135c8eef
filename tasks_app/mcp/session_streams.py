"""The session ``GET`` streams of the 2025-11-25 wire, fed by one watcher thread per process.

A ``GET`` with a session's ``Mcp-Session-Id`` opens the server-to-client stream: keep-alive
comments, ``notifications/tasks/status`` for the client's tasks that change while it is
open, and the questions of its waiting tasks that no ``tasks/result`` stream carries. It
ends after ``TASKDESK_STREAM_SECONDS`` (the client opens a new one), when its session ends
(``DELETE``), or within a tenth of a second of the client leaving.

Each open stream holds a request thread (``stream_slots`` bounds how many), but not the
database: what the streams need (the tasks that changed, the waiting tasks' questions,
which sessions still exist) is read for all open streams of the process at once by one
watcher thread, about once a second. A thousand open streams cost the same three or four
queries a second as one; each stream only filters what the watcher hands it.

The same watcher feeds the 2026-07-28 ``subscriptions/listen`` streams (``tasks_app.mcp.listen``):
a watch with ``task_ids`` gets, for those of its tasks that changed or wait for input, the body
``tasks/get`` would return (built from the same reads, with no further query).

It reads when something happened, not only once a second: on PostgreSQL it ``LISTEN``s on
``TASK_CHANGES_CHANNEL``, where a trigger (migrations ``tasks_app`` 0021 and ``elicitations``
0003) notifies each change of a task's status and each request opened or answered, from any
process on any host; the one-second tick stays as the fallback. Other databases have no
notifications: while a listen stream is open the watcher reads every ``POLL_SECONDS``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg
from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection
from django.http import StreamingHttpResponse
from django.utils import timezone
from rest_framework.request import Request

from elicitations.models import InputRequest
from elicitations.selectors import pending_for_client
from tasks_app.mcp import stream_slots, streaming, wire
from tasks_app.mcp.envelope import Envelope
from tasks_app.mcp.handlers import handshake, tasks
from tasks_app.models import Client, Era, McpSession, Status, Task

log = logging.getLogger("tasks_app.mcp")

# How often the watcher reads the database for the open streams, and how often a stream
# looks at its client's socket while it waits.
TICK_SECONDS = 1.0
PEEK_SECONDS = 0.1
# Without database notifications (SQLite), how often the watcher reads for listen streams.
POLL_SECONDS = 0.25
# The PostgreSQL channel the triggers notify (its payload, a client or task id, is not read).
TASK_CHANGES_CHANNEL = "taskdesk_task_changes"
# The least time between two reads of a watcher woken by notifications.
MIN_GAP_SECONDS = 0.1
# A listen stream reads again the changes of this long before the last one it saw: a change
# stamped earlier may commit later (its body is sent only if the stream has not sent it).
LISTEN_SLACK = timedelta(seconds=2)


@dataclass(frozen=True)
class _Tick:
    """What changed for one stream since the previous tick."""

    changed: list[Task]  # the client's tasks updated since the stream last heard, oldest first
    waiting: list[tuple[Task, list[InputRequest]]]  # its waiting tasks, with pending questions
    session_alive: bool
    # A listen stream's: the tasks/get body of each watched task that changed or waits.
    states: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(eq=False)
class _Watch:
    client_id: int
    session_id: str | None  # None: a listen stream (it watches TASK_IDS)
    since: datetime
    ticks: queue.SimpleQueue[_Tick] = field(default_factory=queue.SimpleQueue)
    task_ids: frozenset[str] = frozenset()

    @property
    def reads_from(self) -> datetime:
        return self.since if self.session_id is not None else self.since - LISTEN_SLACK


class _Watcher:
    """The per-process thread that reads the database for every open stream."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watches: set[_Watch] = set()
        self._wake = threading.Event()
        self._started = False  # a fork makes a new watcher (_after_fork_in_child)

    def watch(
        self,
        client_id: int,
        session_id: str | None,
        since: datetime,
        task_ids: frozenset[str] = frozenset(),
    ) -> _Watch:
        watch = _Watch(client_id=client_id, session_id=session_id, since=since, task_ids=task_ids)
        with self._lock:
            if not self._started:  # the first stream of this process
                self._started = True
                threading.Thread(target=self._run, name="session-streams", daemon=True).start()
            self._watches.add(watch)
        self._wake.set()  # a first tick soon, not at the end of the current second
        return watch

    def forget(self, watch: _Watch) -> None:
        with self._lock:
            self._watches.discard(watch)

    def _run(self) -> None:
        while True:
            with self._lock:
                watches = list(self._watches)
            if not watches:
                connection.close()  # give the connection back while no stream is open
                self._wake.wait()
                self._wake.clear()
                continue
            listening = False
            try:
                close_old_connections()
                listening = self._listen()  # before the reads: a change after them wakes us
                self._tick(watches)
            except (DatabaseError, psycopg.Error) as exc:  # the streams wait (keep-alives go on)
                log.warning("session streams: the database is not answering: %s", exc)
                connection.close()
                listening = False
            polls = not listening and any(w.session_id is None for w in watches)
            self._wait(POLL_SECONDS if polls else TICK_SECONDS, listening)

    def _listen(self) -> bool:
        """LISTEN on TASK_CHANGES_CHANNEL with this thread's connection (again after a new
        connection); False where the database has no notifications."""
        if connection.vendor != "postgresql":
            return False
        connection.ensure_connection()
        raw = connection.connection
        if _listening.get(raw) is None:
            # A notification that arrives while a tick reads is kept by psycopg (its backlog)
            # and ends the next wait at once.
            raw.execute(f'LISTEN "{TASK_CHANGES_CHANNEL}"')
            _listening[raw] = True
        return True

    def _wait(self, seconds: float, listening: bool) -> None:
        """Until SECONDS pass, a stream opens, or (LISTENING) the database notifies a change;
        then take every notification that came (the next reads cover them), but wait at
        least MIN_GAP_SECONDS after the previous reads: a busy database is read at most ten
        times a second, whatever the number of changes."""
        started = time.monotonic()
        if listening:
            raw = connection.connection
            ends = started + seconds
            try:
                while not self._wake.is_set() and (left := ends - time.monotonic()) > 0:
                    # The generator holds the connection's lock: close it before any query.
                    with contextlib.closing(
                        raw.notifies(timeout=min(PEEK_SECONDS, left), stop_after=1)
                    ) as notes:
                        if next(notes, None) is not None:
                            break
                time.sleep(max(0.0, started + MIN_GAP_SECONDS - time.monotonic()))
                with contextlib.closing(raw.notifies(timeout=0)) as notes:
                    for _note in notes:
                        pass
            except Exception as exc:  # psycopg's OperationalError: read again, then listen
                log.warning("session streams: the change notifications stopped: %s", exc)
                connection.close()
        else:
            self._wake.wait(seconds)
        self._wake.clear()

    def _tick(self, watches: list[_Watch]) -> None:
        clients = {w.client_id for w in watches}
        since = min(w.reads_from for w in watches)
        changed = list(
            Task.objects.filter(client_id__in=clients, updated_at__gt=since).order_by("updated_at")
        )
        waiting = list(Task.objects.filter(client_id__in=clients, status=Status.INPUT_REQUIRED))
        questions = pending_for_client([t.pk for t in waiting]) if waiting else {}
        changed_of: dict[int, list[Task]] = {}
        for task in changed:
            changed_of.setdefault(task.client_id, []).append(task)
        waiting_of: dict[int, list[tuple[Task, list[InputRequest]]]] = {}
        for task in waiting:
            if task.pk in questions:
                waiting_of.setdefault(task.client_id, []).append((task, questions[task.pk]))
        sessions = {w.session_id for w in watches if w.session_id is not None}
        alive = (
            set(McpSession.objects.filter(pk__in=sessions).values_list("pk", flat=True))
            if sessions
            else set()
        )
        for w in watches:
            if w.session_id is None:
                w.ticks.put(self._listen_tick(w, changed_of, waiting, questions))
                continue
            mine = [t for t in changed_of.get(w.client_id, []) if t.updated_at > w.since]
            if mine:
                w.since = mine[-1].updated_at
            w.ticks.put(
                _Tick(
                    changed=mine,
                    waiting=waiting_of.get(w.client_id, []),
                    session_alive=w.session_id in alive,
                )
            )

    @staticmethod
    def _listen_tick(
        w: _Watch,
        changed_of: dict[int, list[Task]],
        waiting: list[Task],
        questions: dict[str, list[InputRequest]],
    ) -> _Tick:
        """What a listen stream is handed: the tasks/get body of each of its tasks that
        changed since it last heard (with the slack) or waits for input."""
        states: dict[str, dict[str, Any]] = {}
        for task in changed_of.get(w.client_id, []):
            if task.pk in w.task_ids and task.updated_at > w.reads_from:
                states[task.pk] = tasks.detailed(task, questions)
                w.since = max(w.since, task.updated_at)
        for task in waiting:
            if task.pk in w.task_ids and task.client_id == w.client_id:
                states[task.pk] = tasks.detailed(task, questions)
        return _Tick(changed=[], waiting=[], session_alive=True, states=states)


_watcher = _Watcher()
# The watcher's connections that LISTEN already (a new connection must LISTEN again).
_listening: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def watch_tasks(client_id: int, task_ids: frozenset[str], since: datetime) -> _Watch:
    """A listen stream's watch of TASK_IDS (tasks of CLIENT_ID), from SINCE on."""
    return _watcher.watch(client_id, None, since, task_ids)


def forget(watch: _Watch) -> None:
    _watcher.forget(watch)


def next_tick(request: Request, watch: _Watch, seconds: float) -> _Tick | bool | None:
    return _next_tick(request, watch, seconds)


def _after_fork_in_child() -> None:
    global _watcher
    _watcher = _Watcher()  # a lock held at the fork would stay held in the child


os.register_at_fork(after_in_child=_after_fork_in_child)


class _Held:
    """A stream's events that give the slot back when the response is closed, even if the
    server never started reading them (closing an unstarted generator runs no ``finally``)."""

    def __init__(self, events: Iterator[bytes], slot: stream_slots.Slot) -> None:
        self.events = events
        self.slot = slot

    def __iter__(self) -> _Held:
        return self

    def __next__(self) -> bytes:
        return next(self.events)

    def close(self) -> None:
        try:
            close = getattr(self.events, "close", None)
            if close is not None:
                close()
        finally:
            self.slot.close()


Held = _Held  # for the listen streams (tasks_app.mcp.listen)
Tick = _Tick
Watch = _Watch


def _next_tick(request: Request, watch: _Watch, seconds: float) -> _Tick | bool | None:
    """The watcher's next tick for WATCH, None if SECONDS pass without one, or False as soon
    as the client has gone (its socket is looked at every PEEK_SECONDS)."""
    ends = time.monotonic() + seconds
    while (left := ends - time.monotonic()) > 0:
        try:
            return watch.ticks.get(timeout=min(PEEK_SECONDS, left))
        except queue.Empty:
            if stream_slots.peer_gone(request):
                return False
    return None


def session_stream(
    request: Request,
    session: McpSession,
    client: Client,
    slot: stream_slots.Slot,
    envelope: Envelope,
) -> StreamingHttpResponse:
    """The standalone server-to-client stream of SESSION, holding SLOT while it is open."""
    opened = timezone.now() - timedelta(milliseconds=1)  # changes from the GET on are sent

    def events() -> Iterator[bytes]:
        watch = _watcher.watch(client.pk, session.pk, opened)
        streaming.release_connections()  # the watcher reads the database for this stream
        try:
            yield b": stream open\n\n"
            ends = time.monotonic() + settings.TASKDESK_STREAM_SECONDS
            keepalive = settings.TASKDESK_KEEPALIVE_SECONDS
            quiet_since = time.monotonic()
            considered: set[tuple[str, str]] = set()
            while time.monotonic() < ends:
                tick = _next_tick(request, watch, min(ends - time.monotonic(), keepalive))
                if tick is False:
                    return  # the client has gone
                if isinstance(tick, _Tick):
                    if not tick.session_alive:
                        return  # DELETE ended the session
                    for task in tick.changed:
                        note = {
                            "jsonrpc": "2.0",
                            "method": "notifications/tasks/status",
                            "params": wire.task_fields(task, Era.LEGACY),
                        }
                        yield b"event: message\ndata: " + streaming.dumps(note) + b"\n\n"
                        quiet_since = time.monotonic()
                    for task, questions in tick.waiting:
                        if handshake.result_stream_open(task.pk):
                            continue  # its tasks/result stream carries the questions
                        for question in questions:
                            if (task.pk, question.key) in considered or not handshake.asks_client(
                                envelope, question
                            ):
                                continue
                            considered.add((task.pk, question.key))
                            # Once per session: a tasks/result stream (of any web process)
                            # or an earlier GET stream may have sent it.
                            if not handshake.may_ask(
                                session.pk, task.pk, question.key, stream=handshake.GET_STREAM
                            ):
                                continue
                            body = handshake.question_request(task, question)
                            yield b"event: message\ndata: " + streaming.dumps(body) + b"\n\n"
                            quiet_since = time.monotonic()
                if time.monotonic() - quiet_since >= keepalive:
                    yield b": ping\n\n"
                    quiet_since = time.monotonic()
        finally:
            _watcher.forget(watch)
            slot.close()

    response = StreamingHttpResponse(_Held(events(), slot), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response
