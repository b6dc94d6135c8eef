"""The watcher that feeds every open session stream of a process: a constant number of
queries per tick whatever the number of streams, and each stream gets only its client's."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tasks_app import sessions, transitions
from tasks_app.mcp import session_streams
from tasks_app.models import Status, Task
from tests.tasks_app.mcp.test_handshake import open_question

pytestmark = pytest.mark.django_db(transaction=True)


def make_task(client, name: str = "slow_echo") -> Task:  # type: ignore[no-untyped-def]
    from tasks_app.acceptance import new_task

    task = new_task(client, _tool(name), {"text": "hi", "seconds": 5}, "fp", None, "2025-11-25")
    task.save()
    return task


def _tool(name: str):  # type: ignore[no-untyped-def]
    from tasks_app.mcp import catalog

    return catalog.current().tools[name]


def watches(count: int, client, session_id: str, since):  # type: ignore[no-untyped-def]
    return [
        session_streams._Watch(client_id=client.pk, session_id=session_id, since=since)
        for _ in range(count)
    ]


@pytest.mark.parametrize("streams", [1, 40])
def test_a_tick_costs_the_same_queries_for_one_stream_or_many(
    alice, bob, streams, django_assert_num_queries
) -> None:  # type: ignore[no-untyped-def]
    since = timezone.now() - timedelta(seconds=1)
    alice_session = sessions.open_session(
        client=alice, protocol_version="2025-11-25", capabilities={}, client_info={}
    )
    bob_session = sessions.open_session(
        client=bob, protocol_version="2025-11-25", capabilities={}, client_info={}
    )
    mine = make_task(alice)
    theirs = make_task(bob)
    waiting = make_task(alice)
    open_question(waiting.pk)
    transitions.complete(task_id=mine.pk, result={"content": [], "isError": False})
    transitions.complete(task_id=theirs.pk, result={"content": [], "isError": False})
    alices = watches(streams, alice, alice_session.pk, since)
    bobs = watches(streams, bob, bob_session.pk, since)

    with django_assert_num_queries(4):  # changed tasks, waiting tasks, questions, sessions
        session_streams._Watcher()._tick(alices + bobs)

    for watch in alices:
        tick = watch.ticks.get_nowait()
        assert {t.pk for t in tick.changed} == {mine.pk, waiting.pk}
        assert [(t.pk, [q.ask_key for q in qs]) for t, qs in tick.waiting] == [
            (waiting.pk, ["confirm"])
        ]
        assert tick.session_alive
    for watch in bobs:
        tick = watch.ticks.get_nowait()
        assert [t.pk for t in tick.changed] == [theirs.pk] and tick.waiting == []

    # The next tick hands on only what changed since, and tells a stream its session ended.
    sessions.end_session(bob_session)
    session_streams._Watcher()._tick(alices + bobs)
    assert alices[0].ticks.get_nowait().changed == []
    assert bobs[0].ticks.get_nowait().session_alive is False
    assert Task.objects.get(pk=waiting.pk).status == Status.INPUT_REQUIRED
