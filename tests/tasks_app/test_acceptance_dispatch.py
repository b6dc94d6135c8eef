"""The dispatch records of accepted tasks reach the broker: after commit, or by the sweeper.

Messages are read back from the run's real broker (the embedded filesystem broker, or Redis
when CELERY_BROKER_URL names one).
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
import time_machine
from django.utils import timezone

from tasks_app import acceptance, dispatch, transitions
from tasks_app.models import Dispatch, Era, Task
from tasks_app.tasks import sweep_job
from tests.tasks_app.acceptance_tools import ECHO


def broker_messages(wait: float = 0.5) -> list[dict[str, Any]]:
    """Take every message from the default queue: [{"task": job name, "kwargs": ...}],
    waiting up to WAIT seconds for the first and a little for each next one."""
    from config.celery import app

    found = []
    deadline = time.monotonic() + wait
    with app.connection_for_read() as conn:
        queue = conn.SimpleQueue(app.conf.task_default_queue)
        try:
            while True:
                try:
                    message = queue.get_nowait()
                except queue.Empty:
                    if time.monotonic() > deadline:
                        return found
                    time.sleep(0.02)
                    continue
                found.append({"task": message.headers["task"], "kwargs": message.payload[1]})
                message.ack()
                deadline = time.monotonic() + 0.1
        finally:
            queue.close()


@pytest.fixture(autouse=True)
def _empty_queue() -> None:
    broker_messages(wait=0.1)


def accept(client: Any, key: str | None = None) -> acceptance.Receipt:
    return acceptance.accept(
        client=client,
        tool=ECHO,
        arguments={"text": "hi"},
        era=Era.MODERN,
        key=acceptance.IdempotencyKey(key, "header") if key else None,
    )


def runs(messages: list[dict[str, Any]]) -> list[tuple[str, int]]:
    assert {m["task"] for m in messages} <= {"run_task_job"}
    return sorted((m["kwargs"]["task_id"], m["kwargs"]["dispatch_id"]) for m in messages)


def test_a_committed_record_is_published_and_marked(transactional_db, alice) -> None:
    receipt = accept(alice, "k-1")
    assert dispatch.wait_for_publisher(10)

    record = Dispatch.objects.get(task=receipt.task)
    assert record.published_at is not None
    assert record.attempts == 1
    assert runs(broker_messages()) == [(receipt.task.pk, record.pk)]


def test_every_committed_record_is_published_and_marked_once(transactional_db, alice) -> None:
    receipts = [accept(alice) for _ in range(20)]
    assert dispatch.wait_for_publisher(10)

    records = Dispatch.objects.filter(task__in=[r.task for r in receipts])
    assert records.filter(published_at__isnull=True).count() == 0
    assert runs(broker_messages()) == sorted((r.task_id, r.pk) for r in records)


def test_the_sweeper_publishes_records_left_unpublished(db, alice, settings) -> None:
    # Inside a test transaction nothing commits, so the records stay unpublished: as if the
    # process had died between commit and publish.
    settings.TASKDESK_DISPATCH_GRACE_SECONDS = 3
    tasks = [accept(alice).task for _ in range(3)]

    assert dispatch.publish_pending() == 0  # still within the grace period
    assert broker_messages(wait=0.3) == []

    with time_machine.travel(timezone.now() + timedelta(seconds=4)):
        assert dispatch.publish_pending() == 3

    records = Dispatch.objects.filter(task__in=tasks)
    assert all(r.published_at is not None and r.attempts == 1 for r in records)
    assert runs(broker_messages()) == sorted((r.task_id, r.pk) for r in records)
    with time_machine.travel(timezone.now() + timedelta(seconds=8)):
        assert dispatch.publish_pending() == 0  # published once, not again


def test_an_unpublished_record_a_leg_already_consumed_is_not_published(db, alice, settings) -> None:
    # A waiting leg ran the task from its record before any message was marked (the web
    # process that sent it died): the record needs no message, and is not counted as one.
    from tasks_app.metrics import DatabaseCollector

    settings.TASKDESK_DISPATCH_GRACE_SECONDS = 0
    task = accept(alice, "k-consumed").task
    Dispatch.objects.filter(task=task).update(consumed_at=timezone.now())

    assert dispatch.publish_pending() == 0
    assert broker_messages(wait=0.3) == []
    gauges = {m.name: m.samples[0].value for m in DatabaseCollector().collect() if m.samples}
    assert gauges["taskdesk_dispatch_unpublished"] == 0


def test_the_sweep_job_publishes_them_too(db, alice, settings) -> None:
    settings.TASKDESK_DISPATCH_GRACE_SECONDS = 0
    task = accept(alice, "k-1").task
    sweep_job()
    record = Dispatch.objects.get(task=task)
    assert record.published_at is not None
    assert runs(broker_messages()) == [(task.pk, record.pk)]


def test_a_published_record_that_no_leg_consumed_is_published_again(db, alice, settings) -> None:
    settings.TASKDESK_DISPATCH_REPUBLISH_SECONDS = 60
    lost, consumed, finished = (accept(alice).task for _ in range(3))
    long_ago = timezone.now() - timedelta(seconds=61)
    Dispatch.objects.update(published_at=long_ago, attempts=1)
    Dispatch.objects.filter(task=consumed).update(consumed_at=long_ago)
    transitions.complete(task_id=finished.pk, result={"content": [], "isError": False})

    assert dispatch.publish_pending() == 1

    record = Dispatch.objects.get(task=lost)
    assert record.attempts == 2
    assert record.published_at is not None and record.published_at > long_ago
    assert runs(broker_messages()) == [(lost.pk, record.pk)]
    assert dispatch.publish_pending() == 0  # not again before another wait


def test_a_replay_publishes_nothing(transactional_db, alice) -> None:
    accept(alice, "k-1")
    assert dispatch.wait_for_publisher(10)
    broker_messages()
    accept(alice, "k-1")
    assert dispatch.wait_for_publisher(10)
    assert broker_messages(wait=0.3) == []
    assert Task.objects.count() == Dispatch.objects.count() == 1


def test_a_record_no_leg_consumes_is_published_again_with_backoff(db, alice, settings) -> None:
    settings.TASKDESK_DISPATCH_REPUBLISH_SECONDS = 60
    task = accept(alice).task
    published = timezone.now()
    Dispatch.objects.update(published_at=published, attempts=1)
    record = Dispatch.objects.get(task=task)
    # After the n-th publication the next one waits 60 s x 2^(n-1): 60, 120, 240, 480, ...
    waits = []
    for _ in range(4):
        before = record.attempts
        for seconds in range(30, 2000, 30):
            with time_machine.travel(record.published_at + timedelta(seconds=seconds)):
                if dispatch.publish_pending():
                    waits.append(seconds)
                    break
        record.refresh_from_db()
        assert record.attempts == before + 1
    assert waits == [60, 120, 240, 480]
    assert runs(broker_messages()) == [(task.pk, record.pk)] * 4
