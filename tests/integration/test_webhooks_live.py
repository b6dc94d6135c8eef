"""Webhooks through real processes: legs end tasks in the worker (the single-statement end
on PostgreSQL), beat schedules the delivery job, the control worker sends; a local receiver
verifies every delivery with ``standardwebhooks``."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import pytest
from django.urls import reverse
from django.utils import timezone

from tasks_app import transitions, webhooks
from tasks_app.models import DeliveryAttempt, OutboxMessage, Task
from tests.integration.worker_helpers import runtime_stack, submit, terminal
from tests.live import live_stack, wait_for
from tests.webhook_receiver import Receiver

pytestmark = pytest.mark.live

STACK_ENV = {
    "TASKDESK_WEBHOOK_ALLOW_HTTP_LOOPBACK": "1",
    "TASKDESK_WEBHOOK_SECONDS": "0.5",
    "TASKDESK_WEBHOOK_BACKOFF_SECONDS": "0.2",
    "TASKDESK_WEBHOOK_BACKOFF_MAX_SECONDS": "1",
    "TASKDESK_WEBHOOK_TIMEOUT_SECONDS": "2",
}


@pytest.fixture
def receiver(settings) -> Iterator[Receiver]:  # type: ignore[no-untyped-def]
    settings.TASKDESK_WEBHOOK_ALLOW_HTTP_LOOPBACK = True
    running = Receiver()
    yield running
    running.close()


def _register(client, receiver: Receiver, events: list[str]) -> None:  # type: ignore[no-untyped-def]
    _, receiver.secret = webhooks.register(client=client, url=receiver.url, events=events)


def test_a_failing_receiver_gets_the_event_on_the_fourth_attempt(  # type: ignore[no-untyped-def]
    transactional_db, settings, alice, receiver, operator, client
) -> None:
    receiver.script = [500, 500, 500]
    _register(alice, receiver, ["task.completed"])
    with runtime_stack(settings, **STACK_ENV) as stack:
        task = terminal(submit(alice, "noop"))
        wait_for(
            "the fourth delivery",
            lambda: len(receiver.deliveries) >= 4,
            timeout=60,
            explain=lambda: stack.log("control")[-3000:],
        )
        wait_for(
            "the message to be marked delivered",
            lambda: OutboxMessage.objects.filter(delivered_at__isnull=False).exists(),
            timeout=20,
        )
    assert [d.status for d in receiver.deliveries] == [500, 500, 500, 200]
    assert all(d.verified for d in receiver.deliveries)
    assert receiver.ids() == {OutboxMessage.objects.get().message_id}
    assert receiver.deliveries[-1].body["data"]["taskId"] == task.pk
    assert receiver.deliveries[-1].body["type"] == "task.completed"
    assert DeliveryAttempt.objects.count() == 4
    client.force_login(operator)
    page = client.get(reverse("task_detail", args=[task.pk])).content.decode()
    assert page.count('class="webhook-attempt"') == 4


def test_a_sender_killed_mid_delivery_loses_nothing(  # type: ignore[no-untyped-def]
    transactional_db, settings, alice, receiver
) -> None:
    receiver.hold_first = 30  # the first delivery stays in flight until the sender dies
    _register(alice, receiver, ["task.completed"])
    with live_stack(env=STACK_ENV, worker=False) as stack:
        task = Task.objects.create(client=alice, tool_name="noop", arguments={})
        transitions.complete(task_id=task.pk, result={"content": []})
        assert receiver.received.wait(30), stack.log("control")[-3000:]
        # The control worker runs its jobs in its one process: killed, its process manager
        # starts it again (systemd, Kubernetes), as this test does.
        stack.stop("control", signal.SIGKILL)
        stack.start_control()
        wait_for(
            "a second delivery after the sender died",
            lambda: len(receiver.deliveries) >= 2,
            timeout=60,
            explain=lambda: stack.log("control")[-3000:],
        )
        wait_for(
            "the message to be marked delivered",
            lambda: OutboxMessage.objects.filter(delivered_at__isnull=False).exists(),
            timeout=30,
        )
    message = OutboxMessage.objects.get()
    assert receiver.ids() == {message.message_id}  # the same webhook-id both times
    assert all(d.verified for d in receiver.deliveries)
    assert {d.body["data"]["taskId"] for d in receiver.deliveries} == {task.pk}


@pytest.mark.slow
def test_a_thousand_tasks_completing_at_once_are_all_delivered_within_a_minute(  # type: ignore[no-untyped-def]
    transactional_db, settings, alice, receiver
) -> None:
    _register(alice, receiver, ["task.completed"])
    tasks = Task.objects.bulk_create(
        Task(client=alice, tool_name="noop", arguments={}) for _ in range(1000)
    )
    with live_stack(env=STACK_ENV, worker=False) as stack:
        started = time.monotonic()
        for task in tasks:
            transitions.complete(task_id=task.pk, result={"content": []})
        ended = time.monotonic()
        wait_for(
            "1,000 deliveries",
            lambda: len(receiver.ids()) >= 1000,
            timeout=60 - (time.monotonic() - started),
            every=0.5,
            explain=lambda: f"{len(receiver.ids())} delivered\n{stack.log('control')[-2000:]}",
        )
        took = time.monotonic() - started
    print(f"1,000 completions in {ended - started:.1f} s, all delivered after {took:.1f} s")
    assert all(d.verified for d in receiver.deliveries)
    assert {d.body["data"]["taskId"] for d in receiver.deliveries} == {t.pk for t in tasks}
    assert (
        not OutboxMessage.objects.filter(delivered_at__isnull=True)
        .exclude(due_at__gt=timezone.now())
        .exists()
    )
