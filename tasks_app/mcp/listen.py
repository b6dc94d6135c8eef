"""``subscriptions/listen`` (2026-07-28): a client's stream of ``notifications/tasks``.

A client that declares the tasks extension lists in ``params.notifications.taskIds`` the
tasks it wants to hear about; the answer is an event stream (ext-tasks 2026-07-28, "Task
Status Notifications"; the core's subscriptions pattern):

1. ``notifications/subscriptions/acknowledged`` with the ids the server agreed to watch:
   only the client's own tasks (an unknown id and another client's are left out alike);
2. one ``notifications/tasks`` per watched task with its current state, so a client that
   reconnects misses nothing between two streams;
3. a ``notifications/tasks`` each time a watched task's status, or its set of pending
   ``inputRequests``, changes. Its params are the body ``tasks/get`` would return at that
   moment (``handlers.tasks.detailed``);
4. after ``TASKDESK_STREAM_SECONDS`` the request's result, and the stream ends (the client
   listens again).

Every notification carries ``_meta["io.modelcontextprotocol/subscriptionId"]``, the listen
request's id, and so does the result. Nothing else goes on the stream (no
``notifications/progress`` or ``notifications/message``; the list and resource
subscriptions are not acknowledged: Taskdesk's lists change only on redeploy, and
``server/discover`` says ``listChanged: false``). Asking for ``taskIds`` without the
extension is -32021.

A stream holds a slot of ``stream_slots`` (per client and per process; 429 ``busy`` beyond)
until it ends or its client leaves. It learns of changes from the session streams' watcher
(``session_streams``), which reads once for every open stream of the process.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.http import StreamingHttpResponse
from django.utils import timezone

from elicitations.selectors import pending_for_client
from tasks_app.mcp import session_streams, stream_slots, streaming
from tasks_app.mcp.errors import tasks_extension_required
from tasks_app.mcp.handlers import tasks
from tasks_app.mcp.methods import methods
from tasks_app.mcp.params import ListenParams
from tasks_app.mcp.registry import Call
from tasks_app.models import Status, Task

SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"


def _signature(body: dict[str, Any]) -> tuple[str, tuple[str, ...]]:
    """What a notification is sent for: the status and the pending requests' keys."""
    return body["status"], tuple(sorted(body.get("inputRequests") or ()))


def _event(message: dict[str, Any]) -> bytes:
    return b"event: message\ndata: " + streaming.dumps(message) + b"\n\n"


class _Held(session_streams.Held):
    """Gives back the slot and forgets the watch when the response is closed, even if the
    server never started reading the events."""

    def __init__(
        self, events: Iterator[bytes], slot: stream_slots.Slot, watch: session_streams.Watch
    ) -> None:
        super().__init__(events, slot)
        self.watch = watch

    def close(self) -> None:
        try:
            super().close()
        finally:
            session_streams.forget(self.watch)


@methods.method("subscriptions/listen", params=ListenParams)
def subscriptions_listen(call: Call) -> StreamingHttpResponse:
    wanted = call.data["notifications"].taskIds
    if wanted is not None and not call.envelope.declares_tasks:
        raise tasks_extension_required("Listening for notifications/tasks")
    requested = list(dict.fromkeys(wanted or ()))
    slot = stream_slots.take(call.client.pk)
    try:
        since = timezone.now()  # the watcher reads from here (and its slack) on
        found = {t.pk: t for t in Task.objects.filter(client_id=call.client.pk, pk__in=requested)}
        watched = [task_id for task_id in requested if task_id in found]
        waiting = [t.pk for t in found.values() if t.status == Status.INPUT_REQUIRED]
        pending = pending_for_client(waiting) if waiting else {}
        first = [tasks.detailed(found[task_id], pending) for task_id in watched]
        watch = session_streams.watch_tasks(call.client.pk, frozenset(watched), since)
    except BaseException:
        slot.close()
        raise
    streaming.release_connections()  # the watcher reads the database for this stream
    meta = {SUBSCRIPTION_ID: call.id}
    acknowledged = {"taskIds": watched} if wanted is not None else {}

    def note(body: dict[str, Any]) -> bytes:
        # The DetailedTask of tasks/get, without the result's resultType.
        params = {k: v for k, v in body.items() if k != "resultType"}
        return _event(
            {"jsonrpc": "2.0", "method": "notifications/tasks", "params": {**params, "_meta": meta}}
        )

    def events() -> Iterator[bytes]:
        sent: dict[str, tuple[str, tuple[str, ...]]] = {}
        try:
            yield _event(
                {
                    "jsonrpc": "2.0",
                    "method": "notifications/subscriptions/acknowledged",
                    "params": {"_meta": meta, "notifications": acknowledged},
                }
            )
            for body in first:
                sent[body["taskId"]] = _signature(body)
                yield note(body)
            ends = time.monotonic() + settings.TASKDESK_STREAM_SECONDS
            keepalive = settings.TASKDESK_KEEPALIVE_SECONDS
            quiet_since = time.monotonic()
            while (left := ends - time.monotonic()) > 0:
                tick = session_streams.next_tick(call.request, watch, min(left, keepalive))
                if tick is False:
                    return  # the client has gone
                if isinstance(tick, session_streams.Tick):
                    for task_id, body in tick.states.items():
                        if sent.get(task_id) != _signature(body):
                            sent[task_id] = _signature(body)
                            yield note(body)
                            quiet_since = time.monotonic()
                if time.monotonic() - quiet_since >= keepalive:
                    yield b": ping\n\n"
                    quiet_since = time.monotonic()
            # Free before the answer goes out: a client that listens again at once finds
            # its slot.
            session_streams.forget(watch)
            slot.close()
            yield _event(streaming.success(call.id, {"_meta": meta}))
        finally:
            session_streams.forget(watch)
            slot.close()

    response = StreamingHttpResponse(_Held(events(), slot, watch), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response
