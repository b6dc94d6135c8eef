"""Webhooks: registering endpoints, the outbox rows every status change writes, delivery with
retries (against a local receiver that verifies every delivery with ``standardwebhooks``),
the task page and the deliveries page."""

from __future__ import annotations

import io
import json
import socket
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from tasks_app import outbox, transitions, webhooks
from tasks_app.models import (
    DeliveryAttempt,
    EventKind,
    OutboxMessage,
    Task,
    TaskEvent,
    WebhookEndpoint,
)
from tests.webhook_receiver import Receiver

ALL = ["task.completed", "task.failed", "task.cancelled", "task.input_required", "effect.unknown"]


@pytest.fixture(autouse=True)
def _webhook_settings(settings):  # type: ignore[no-untyped-def]
    settings.TASKDESK_WEBHOOK_ALLOW_HTTP_LOOPBACK = True
    settings.TASKDESK_WEBHOOK_ALLOWED_NETWORKS = []
    settings.TASKDESK_WEBHOOK_BACKOFF_SECONDS = 0.01
    settings.TASKDESK_WEBHOOK_BACKOFF_MAX_SECONDS = 0.02
    settings.TASKDESK_WEBHOOK_TIMEOUT_SECONDS = 2.0


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    running = Receiver()
    yield running
    running.close()


@pytest.fixture
def task(alice):  # type: ignore[no-untyped-def]
    return Task.objects.create(client=alice, tool_name="slow_echo", arguments={"text": "hi"})


def _endpoint(alice, receiver: Receiver, events: list[str] = ALL) -> WebhookEndpoint:  # type: ignore[no-untyped-def]
    endpoint, secret = webhooks.register(client=alice, url=receiver.url, events=events)
    receiver.secret = secret
    return endpoint


def _deliver_until_settled(rounds: int = 50) -> None:
    """Run the sender as the control job does until no message is left to send."""
    for _ in range(rounds):
        webhooks.deliver_due(seconds=5)
        if not OutboxMessage.objects.filter(
            delivered_at__isnull=True, gave_up_at__isnull=True
        ).exists():
            return
        OutboxMessage.objects.update(due_at=timezone.now())  # skip the (tiny) backoff
    raise AssertionError("messages left undelivered")


# --- registration ------------------------------------------------------------------------------


def test_the_secret_is_in_the_standard_webhooks_format(alice) -> None:  # type: ignore[no-untyped-def]
    endpoint, secret = webhooks.register(
        client=alice, url="http://127.0.0.1:9/hook", events=["task.completed"]
    )
    assert secret.startswith("whsec_")
    assert len(__import__("base64").b64decode(secret.removeprefix("whsec_"))) == 32
    assert endpoint.secret == secret


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.5/hook",  # http to a private address
        "http://192.168.1.20:8080/hook",
        "https://10.1.2.3/hook",  # https, but private
        "https://169.254.169.254/latest/meta-data",  # link-local (cloud metadata)
        "https://[fd00::1]/hook",  # IPv6 unique local
        "https://0.0.0.0/hook",
        "ftp://example.com/hook",
    ],
)
def test_a_private_or_non_https_url_is_refused_at_registration(alice, url: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValidationError, match="refused"):
        webhooks.register(client=alice, url=url, events=["task.completed"])
    assert not WebhookEndpoint.objects.exists()


def test_allowed_networks_let_a_private_https_address_through(alice, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_WEBHOOK_ALLOWED_NETWORKS = ["10.1.0.0/16"]
    webhooks.register(client=alice, url="https://10.1.2.3/hook", events=["task.failed"])
    with pytest.raises(ValidationError):  # still https only
        webhooks.register(client=alice, url="http://10.1.2.3/hook", events=["task.failed"])
    # another network, refused with the setting that would let it through
    with pytest.raises(ValidationError, match="with TASKDESK_WEBHOOK_ALLOWED_NETWORKS"):
        webhooks.register(client=alice, url="https://10.2.0.1/hook", events=["task.failed"])


def test_loopback_needs_the_setting(alice, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_WEBHOOK_ALLOW_HTTP_LOOPBACK = False
    for url in ("http://127.0.0.1:8000/hook", "https://localhost/hook"):
        with pytest.raises(ValidationError):
            webhooks.register(client=alice, url=url, events=["task.failed"])


def test_unknown_events_are_refused(alice) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValidationError, match="Choose events"):
        webhooks.register(client=alice, url="http://127.0.0.1:9/", events=["task.exploded"])


def test_add_webhook_prints_the_secret_once(alice) -> None:  # type: ignore[no-untyped-def]
    out, err = io.StringIO(), io.StringIO()
    call_command(
        "add_webhook",
        "--client", "alice", "--url", "http://127.0.0.1:9/hook",
        "--events", "task.completed", "task.failed",
        stdout=out, stderr=err,
    )  # fmt: skip
    secret = out.getvalue().strip()
    endpoint = WebhookEndpoint.objects.get()
    assert (endpoint.secret, endpoint.events) == (secret, ["task.completed", "task.failed"])
    assert "shown once" in err.getvalue()
    with pytest.raises(CommandError, match="refused"):
        call_command(
            "add_webhook", "--client", "alice", "--url", "http://10.0.0.5/hook",
            "--events", "task.completed", stdout=out, stderr=err,
        )  # fmt: skip


# --- the outbox, written with the transition ------------------------------------------------------


def test_no_endpoint_no_message(task) -> None:  # type: ignore[no-untyped-def]
    transitions.complete(task_id=task.pk, result={"content": []})
    assert not OutboxMessage.objects.exists()


def test_each_status_change_writes_a_message_for_subscribed_endpoints(alice, receiver) -> None:  # type: ignore[no-untyped-def]
    hook = _endpoint(alice, receiver, ["task.completed", "task.input_required"])
    other = _endpoint(alice, receiver, ["task.failed"])
    tasks = [Task.objects.create(client=alice, tool_name="t", arguments={}) for _ in range(3)]
    transitions.require_input(task_id=tasks[0].pk, message="?")
    transitions.complete(task_id=tasks[1].pk, result={"content": []})
    transitions.fail(task_id=tasks[2].pk, error={"code": 1, "message": "no"})
    rows = set(OutboxMessage.objects.values_list("task_id", "kind", "endpoint_id", "channel"))
    assert rows == {
        (tasks[0].pk, "task.input_required", hook.pk, "webhook"),
        (tasks[1].pk, "task.completed", hook.pk, "webhook"),
        (tasks[2].pk, "task.failed", other.pk, "webhook"),
    }


def test_a_cancel_and_a_disabled_endpoint(alice, receiver) -> None:  # type: ignore[no-untyped-def]
    hook = _endpoint(alice, receiver, ["task.cancelled"])
    _endpoint(alice, receiver, ["task.cancelled"]).delete()
    disabled = _endpoint(alice, receiver, ["task.cancelled"])
    WebhookEndpoint.objects.filter(pk=disabled.pk).update(enabled=False)
    task = Task.objects.create(client=alice, tool_name="t", arguments={})
    transitions.request_cancel(task_id=task.pk, actor_type="client")  # nothing ran: cancelled
    assert list(OutboxMessage.objects.values_list("endpoint_id", "kind")) == [
        (hook.pk, "task.cancelled")
    ]


def test_the_leased_end_writes_the_message_in_its_statement(alice, receiver) -> None:  # type: ignore[no-untyped-def]
    """The single-statement end of a leg (PostgreSQL; the portable path on SQLite)."""
    hook = _endpoint(alice, receiver, ["task.completed"])
    tasks = [Task.objects.create(client=alice, tool_name="t", arguments={}) for _ in range(2)]
    live = timezone.now() + timedelta(minutes=5)
    Task.objects.filter(pk__in=[t.pk for t in tasks]).update(
        lease_owner="w1", leg=1, lease_expires_at=live
    )
    transitions.complete(task_id=tasks[0].pk, result={"content": []}, lease_owner="w1", lease_leg=1)
    transitions.fail(task_id=tasks[1].pk, error={"code": 1, "message": "x"}, lease_owner="w1",
                     lease_leg=1)  # fmt: skip
    message = OutboxMessage.objects.get()
    assert (message.task_id, message.endpoint_id, message.kind) == (
        tasks[0].pk,
        hook.pk,
        "task.completed",
    )
    assert message.message_id.startswith("msg_") and message.due_at <= timezone.now()


def test_a_rolled_back_transition_leaves_no_message(alice, receiver, task) -> None:  # type: ignore[no-untyped-def]
    from django.db import transaction

    _endpoint(alice, receiver, ["task.completed"])
    with pytest.raises(RuntimeError), transaction.atomic():
        transitions.complete(task_id=task.pk, result={"content": []})
        raise RuntimeError
    assert not OutboxMessage.objects.exists()


def test_effect_unknown_writes_a_message(alice, receiver, task) -> None:  # type: ignore[no-untyped-def]
    _endpoint(alice, receiver, ["effect.unknown"])
    with __import__("django.db").db.transaction.atomic():
        outbox.write_for_task(task.pk, EventKind.EFFECT_UNKNOWN, detail={"effect": {"name": "x"}})
    message = OutboxMessage.objects.get()
    assert (message.kind, message.detail) == ("effect.unknown", {"effect": {"name": "x"}})


# --- delivery ----------------------------------------------------------------------------------


def test_three_failures_then_success_four_attempts_on_the_task_page(  # type: ignore[no-untyped-def]
    alice, receiver, task, operator, client
) -> None:
    receiver.script = [500, 500, 500]
    _endpoint(alice, receiver, ["task.completed"])
    transitions.complete(task_id=task.pk, result={"content": [{"type": "text", "text": "hi"}]})

    _deliver_until_settled()

    assert len(receiver.deliveries) == 4
    assert all(d.verified for d in receiver.deliveries)
    assert len(receiver.ids()) == 1  # one message, the same webhook-id every time
    body = receiver.deliveries[-1].body
    assert body["type"] == "task.completed"
    assert body["data"]["taskId"] == task.pk and body["data"]["status"] == "completed"
    assert body["data"]["result"]["content"] == [{"type": "text", "text": "hi"}]
    # Every delivery sent the same bytes.
    assert len({json.dumps(d.body, sort_keys=True) for d in receiver.deliveries}) == 1
    message = OutboxMessage.objects.get()
    assert message.delivered_at is not None and message.attempts == 4
    tries = list(DeliveryAttempt.objects.values_list("status_code", "ok"))
    assert tries == [(500, False), (500, False), (500, False), (200, True)]

    client.force_login(operator)
    page = client.get(reverse("task_detail", args=[task.pk])).content.decode()
    assert page.count('class="webhook-attempt"') == 4
    assert message.message_id in page


def _completed(client, count: int) -> list[Task]:  # type: ignore[no-untyped-def]
    tasks = [Task.objects.create(client=client, tool_name="t", arguments={}) for _ in range(count)]
    for task in tasks:
        transitions.complete(task_id=task.pk, result={"content": []})
    return tasks


def test_one_endpoints_batch_goes_over_one_connection_in_a_fixed_number_of_statements(
    alice, receiver
) -> None:  # type: ignore[no-untyped-def]
    _endpoint(alice, receiver, ["task.completed"])
    _completed(alice, 2)
    with CaptureQueriesContext(connection) as two:
        assert webhooks.deliver_due(seconds=5) == 2
    _completed(alice, 8)
    with CaptureQueriesContext(connection) as eight:
        assert webhooks.deliver_due(seconds=5) == 8
    # Claiming, the tasks' bodies and the attempts: as many statements for eight as for two.
    assert len(eight) == len(two)
    assert receiver.connections == 2  # one per batch
    assert len(receiver.deliveries) == 10 and all(d.verified for d in receiver.deliveries)
    assert not OutboxMessage.objects.filter(delivered_at__isnull=True).exists()
    assert list(OutboxMessage.objects.values_list("attempts", flat=True)) == [1] * 10
    assert DeliveryAttempt.objects.filter(ok=True, status_code=200).count() == 10


@pytest.mark.parametrize(
    "receiver_options",
    [{"keep_alive": False}, {"answer_body": b"x" * 10_000}],
    ids=["a receiver that closes each connection", "an answer longer than what is read"],
)
def test_a_connection_that_cannot_be_kept_is_made_again_for_the_next_message(
    alice, receiver_options
) -> None:  # type: ignore[no-untyped-def]
    receiver = Receiver(**receiver_options)
    try:
        _endpoint(alice, receiver, ["task.completed"])
        _completed(alice, 3)
        assert webhooks.deliver_due(seconds=5) == 3
        assert receiver.connections == 3
        assert [d.verified for d in receiver.deliveries] == [True] * 3
    finally:
        receiver.close()


def test_what_a_batchs_hold_would_not_cover_is_due_again_at_once(alice, receiver) -> None:  # type: ignore[no-untyped-def]
    _endpoint(alice, receiver, ["task.completed"])
    _completed(alice, 3)
    [ids] = outbox.choose("webhook", limit=10).values()
    with outbox.holding("webhook", ids, lease_seconds=600) as taken:
        assert len(taken) == 3
        # A hold that ends before another attempt could: nothing is sent, and the messages
        # wait for the next sender, not for the hold.
        assert webhooks._send_in_turn(taken, starts_until=time.monotonic()) == 0
    assert receiver.deliveries == []
    assert all(m.due_at <= timezone.now() for m in OutboxMessage.objects.all())
    assert OutboxMessage.objects.filter(body__isnull=True).count() == 3  # nothing was sent
    assert [len(ids) for ids in outbox.choose("webhook", limit=10).values()] == [3]


def test_a_failure_in_a_batch_is_retried_alone_and_the_endpoint_is_not_failing_after_a_success(
    alice, receiver, settings
) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_WEBHOOK_BACKOFF_SECONDS = settings.TASKDESK_WEBHOOK_BACKOFF_MAX_SECONDS = 60
    receiver.script = [200, 500, 200]
    hook = _endpoint(alice, receiver, ["task.completed"])
    first, second, third = _completed(alice, 3)
    assert webhooks.deliver_due(seconds=5) == 2
    state = {
        m.task_id: (m.attempts, m.delivered_at is not None, m.last_error)
        for m in OutboxMessage.objects.all()
    }
    assert state == {
        first.pk: (1, True, ""),
        second.pk: (1, False, "HTTP 500"),
        third.pk: (1, True, ""),
    }
    assert OutboxMessage.objects.get(task=second).due_at > timezone.now() + timedelta(seconds=20)
    hook.refresh_from_db()
    assert hook.failing_since is None and hook.enabled


def test_the_connect_time_check_refuses_what_registration_allowed(
    alice, receiver, task, settings
) -> None:  # type: ignore[no-untyped-def]
    _endpoint(alice, receiver, ["task.completed"])
    transitions.complete(task_id=task.pk, result={"content": []})
    settings.TASKDESK_WEBHOOK_ALLOW_HTTP_LOOPBACK = False
    settings.TASKDESK_WEBHOOK_BACKOFF_SECONDS = settings.TASKDESK_WEBHOOK_BACKOFF_MAX_SECONDS = 60
    webhooks.deliver_due(seconds=5)
    assert receiver.deliveries == []
    attempt = DeliveryAttempt.objects.get()
    assert attempt.status_code is None and attempt.error.startswith("refused:")


def test_redirects_are_not_followed(alice, receiver, task, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_WEBHOOK_BACKOFF_SECONDS = settings.TASKDESK_WEBHOOK_BACKOFF_MAX_SECONDS = 60
    receiver.script = [302]
    _endpoint(alice, receiver, ["task.completed"])
    transitions.complete(task_id=task.pk, result={"content": []})
    webhooks.deliver_due(seconds=5)
    assert len(receiver.deliveries) == 1
    assert DeliveryAttempt.objects.get().status_code == 302
    assert OutboxMessage.objects.get().delivered_at is None


def test_an_endpoint_failing_past_the_window_is_disabled(alice, receiver, task, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_WEBHOOK_BACKOFF_SECONDS = settings.TASKDESK_WEBHOOK_BACKOFF_MAX_SECONDS = 60
    receiver.script = [503] * 10
    hook = _endpoint(alice, receiver, ["task.completed"])
    transitions.complete(task_id=task.pk, result={"content": []})
    webhooks.deliver_due(seconds=5)
    WebhookEndpoint.objects.filter(pk=hook.pk).update(
        failing_since=timezone.now() - timedelta(hours=25)
    )
    OutboxMessage.objects.update(retry_from=timezone.now() - timedelta(hours=25))
    OutboxMessage.objects.update(due_at=timezone.now())
    webhooks.deliver_due(seconds=5)
    hook.refresh_from_db()
    assert not hook.enabled and hook.disabled_at is not None
    assert "failed since" in hook.disabled_reason
    message = OutboxMessage.objects.get()
    assert message.gave_up_at is not None
    entry = TaskEvent.objects.get(task=task, kind=EventKind.WEBHOOK_UNDELIVERED)
    assert entry.detail["webhook_id"] == message.message_id
    # A new event for the disabled endpoint writes nothing.
    other = Task.objects.create(client=alice, tool_name="t", arguments={})
    transitions.complete(task_id=other.pk, result={"content": []})
    assert OutboxMessage.objects.count() == 1


def test_backoff_doubles_with_jitter(settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_WEBHOOK_BACKOFF_SECONDS = 10
    settings.TASKDESK_WEBHOOK_BACKOFF_MAX_SECONDS = 3600
    for attempts, ceiling in [(1, 10), (2, 20), (3, 40), (20, 3600)]:
        waits = [webhooks.backoff_seconds(attempts) for _ in range(50)]
        assert all(ceiling / 2 <= w <= ceiling for w in waits)
        assert len(set(waits)) > 1


def test_a_choice_takes_a_few_messages_per_endpoint(alice, bob, receiver) -> None:  # type: ignore[no-untyped-def]
    a, b = _endpoint(alice, receiver), _endpoint(bob, receiver)
    _completed(alice, 30)
    _completed(bob, 1)
    chosen = outbox.choose("webhook", limit=20, per_endpoint=5)
    assert {endpoint: len(ids) for endpoint, ids in chosen.items()} == {a.pk: 5, b.pk: 1}
    oldest = list(OutboxMessage.objects.filter(endpoint=a).order_by("due_at", "pk"))
    assert chosen[a.pk] == [m.pk for m in oldest[:5]]
    # an endpoint being sent to is left alone
    again = outbox.choose("webhook", limit=20, per_endpoint=5, skip_endpoints=[b.pk])
    assert list(again) == [a.pk]


def test_a_choice_looks_at_the_oldest_few_batches_and_leaves_a_later_endpoint_to_the_next(
    alice, bob, receiver
) -> None:  # type: ignore[no-untyped-def]
    a, b = _endpoint(alice, receiver), _endpoint(bob, receiver)
    _completed(alice, 120)  # more than a choice of 20 looks at
    _completed(bob, 1)
    chosen = outbox.choose("webhook", limit=20, per_endpoint=5)
    assert {endpoint: len(ids) for endpoint, ids in chosen.items()} == {a.pk: 5}
    # The sender chooses again at once, leaving the endpoint it is sending to.
    again = outbox.choose("webhook", limit=20, per_endpoint=5, skip_endpoints=[a.pk])
    assert {endpoint: len(ids) for endpoint, ids in again.items()} == {b.pk: 1}


@pytest.mark.django_db(transaction=True)
def test_a_slow_endpoint_with_a_backlog_does_not_hold_up_another_clients(  # type: ignore[no-untyped-def]
    alice, bob, settings
) -> None:
    """Client 1's endpoint answers after 2 s and has 30 messages due before client 2's one:
    client 2's message arrives at once, not after client 1's backlog; client 1's endpoint
    never gets two at once."""
    settings.TASKDESK_WEBHOOK_TIMEOUT_SECONDS = 3.0
    slow, other = Receiver(hold_each=2.0), Receiver()
    try:
        _endpoint(alice, slow)
        _endpoint(bob, other)
        _completed(alice, 30)
        _completed(bob, 1)

        def run() -> None:
            try:
                webhooks.deliver_due(seconds=1)
            finally:
                __import__("django.db").db.connections.close_all()

        sender = threading.Thread(target=run)
        started = time.monotonic()
        sender.start()
        assert other.received.wait(timeout=10)
        arrived = time.monotonic() - started
        sender.join(timeout=60)
        assert arrived < 1.5, f"client 2's webhook came after {arrived:.1f} s"
        assert len(other.deliveries) == 1 and other.deliveries[0].verified
        # client 1's first few went one after another (2 s each), the rest wait their turn
        assert 1 <= len(slow.deliveries) <= 10 and slow.most_at_once == 1
        assert OutboxMessage.objects.filter(delivered_at__isnull=False).count() == 1 + len(
            slow.deliveries
        )
    finally:
        slow.close()
        other.close()


@pytest.mark.django_db(transaction=True)
def test_a_steady_stream_is_claimed_in_batches_that_gather_not_one_by_one(alice, receiver) -> None:  # type: ignore[no-untyped-def]
    """A message every 10 ms while the sender runs (again 50 ms after a run ends): each claim
    takes what gathered since the last (a batch's messages are delivered together, at one
    time), not a message or two, and every message is delivered."""
    _endpoint(alice, receiver, ["task.completed"])
    (task,) = _completed(alice, 1)
    stop = threading.Event()

    def run() -> None:
        try:
            while not stop.is_set():
                webhooks.deliver_due(seconds=2)
                stop.wait(0.05)
        finally:
            __import__("django.db").db.connections.close_all()

    sender = threading.Thread(target=run)
    sender.start()
    try:
        until = time.monotonic() + 1.5
        while time.monotonic() < until:
            outbox.write_for_task(task, "task.completed")
            time.sleep(0.01)
    finally:
        stop.set()
        sender.join(timeout=30)
    webhooks.deliver_due(seconds=5)  # what came after the sender's last run
    written = OutboxMessage.objects.count()
    delivered = OutboxMessage.objects.filter(delivered_at__isnull=False)
    assert delivered.count() == written == len(receiver.deliveries)
    batches = delivered.values("delivered_at").distinct().count()
    # A claim at most every 0.25 s while messages keep coming, and the last run's: about
    # seven batches, more only if the writer here was slowed (then four messages a batch).
    assert batches <= max(12, written // 4), f"{written} messages in {batches} claims"


# --- the deliveries page -----------------------------------------------------------------------


def test_deliveries_page_and_send_again(alice, receiver, task, operator, viewer, client) -> None:  # type: ignore[no-untyped-def]
    _endpoint(alice, receiver, ["task.completed"])
    transitions.complete(task_id=task.pk, result={"content": []})
    _deliver_until_settled()
    message = OutboxMessage.objects.get()
    url = reverse("client_deliveries", args=[alice.pk])
    again = reverse("delivery_send_again", args=[alice.pk, message.pk])

    client.force_login(viewer)
    page = client.get(url)
    assert page.status_code == 200 and message.message_id in page.content.decode()
    assert again not in page.content.decode()  # a viewer cannot send again
    assert client.post(again).status_code == 403

    client.force_login(operator)
    assert again in client.get(url).content.decode()
    assert client.post(again).status_code == 302
    _deliver_until_settled()
    assert [d.webhook_id for d in receiver.deliveries] == [message.message_id] * 2


def test_deliveries_page_is_tenant_scoped(alice, bob, receiver, outsider, client) -> None:  # type: ignore[no-untyped-def]
    from tasks_app.operators import grant_role

    client.force_login(outsider)
    assert client.get(reverse("client_deliveries", args=[alice.pk])).status_code == 404
    bob.tenant.members.add(outsider)
    grant_role(outsider, "operator", bob.tenant)
    assert client.get(reverse("client_deliveries", args=[alice.pk])).status_code == 404
    assert client.get(reverse("client_deliveries", args=[bob.pk])).status_code == 200


def test_send_again_needs_a_post_with_csrf(alice, receiver, task, operator) -> None:  # type: ignore[no-untyped-def]
    from django.test import Client as Browser

    _endpoint(alice, receiver, ["task.completed"])
    transitions.complete(task_id=task.pk, result={"content": []})
    _deliver_until_settled()
    message = OutboxMessage.objects.get()
    browser = Browser(enforce_csrf_checks=True)
    browser.force_login(operator)
    again = reverse("delivery_send_again", args=[alice.pk, message.pk])
    assert browser.get(again).status_code == 405
    assert browser.post(again).status_code == 403  # no CSRF token
    message.refresh_from_db()
    assert message.delivered_at is not None  # not sent again


# --- the admin ---------------------------------------------------------------------------------


@pytest.fixture
def staff(alice, django_user_model):  # type: ignore[no-untyped-def]
    from django.contrib.auth.models import Permission

    user = django_user_model.objects.create_user(username="sam", password="pw", is_staff=True)
    alice.tenant.members.add(user)
    user.user_permissions.add(*Permission.objects.filter(codename__endswith="webhookendpoint"))
    return user


def test_the_admin_registers_an_endpoint_and_shows_its_secret_once(
    alice, bob, staff, client
) -> None:  # type: ignore[no-untyped-def]
    client.force_login(staff)
    add = reverse("admin:tasks_app_webhookendpoint_add")
    form = {"client": alice.pk, "url": "http://127.0.0.1:9/hook", "events": ["task.failed"]}
    page = client.post(add, {**form, "enabled": "on"})
    assert page.status_code == 200
    endpoint = WebhookEndpoint.objects.get()
    assert endpoint.secret.startswith("whsec_") and endpoint.secret in page.content.decode()
    change = client.get(reverse("admin:tasks_app_webhookendpoint_change", args=[endpoint.pk]))
    assert endpoint.secret not in change.content.decode()  # shown once
    refused = client.post(add, {**form, "url": "http://10.0.0.5/hook"})
    assert "refused" in refused.content.decode() and WebhookEndpoint.objects.count() == 1
    # Another tenant's client cannot be chosen.
    other = client.post(add, {**form, "client": bob.pk})
    assert other.status_code == 200 and WebhookEndpoint.objects.count() == 1


# --- https: the checked address, the name in Host and TLS -------------------------------------


def _certificate(folder, name: str) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    """A self-signed certificate for NAME (its own CA): (certificate file, key file)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = timezone.now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(hours=1))
        .not_valid_after(now + timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = folder / "cert.pem", folder / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return str(cert_file), str(key_file)


@pytest.fixture
def dns(monkeypatch):  # type: ignore[no-untyped-def]
    """A resolver the test controls: name -> address (anything else resolves as usual)."""

    names: dict[str, str] = {}
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):  # type: ignore[no-untyped-def]
        if host in names:
            return real(names[host], port, *args, **kwargs)
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return names


def test_https_goes_to_the_checked_address_with_the_name_in_host_and_sni(  # type: ignore[no-untyped-def]
    alice, task, tmp_path, settings, dns
) -> None:
    cert, key = _certificate(tmp_path, "hooks.example.test")
    settings.TASKDESK_WEBHOOK_CA_FILE = cert
    settings.TASKDESK_WEBHOOK_BACKOFF_SECONDS = settings.TASKDESK_WEBHOOK_BACKOFF_MAX_SECONDS = 60
    receiver = Receiver(tls=(cert, key))
    try:
        dns["hooks.example.test"] = "127.0.0.1"
        url = f"https://hooks.example.test:{receiver.port}/in?x=1"
        _, receiver.secret = webhooks.register(client=alice, url=url, events=["task.completed"])
        transitions.complete(task_id=task.pk, result={"content": []})
        webhooks.deliver_due(seconds=5)
        assert [d.verified for d in receiver.deliveries] == [True]
        assert receiver.deliveries[0].headers["host"] == f"hooks.example.test:{receiver.port}"
        assert receiver.server_names == ["hooks.example.test"]
        assert OutboxMessage.objects.get().delivered_at is not None

        # The name now resolves to a private address (DNS rebinding): nothing is sent there.
        dns["hooks.example.test"] = "10.9.8.7"
        other = Task.objects.create(client=alice, tool_name="t", arguments={})
        transitions.complete(task_id=other.pk, result={"content": []})
        webhooks.deliver_due(seconds=5)
        assert len(receiver.deliveries) == 1
        attempt = DeliveryAttempt.objects.get(message__task=other)
        assert attempt.status_code is None and "10.9.8.7" in attempt.error
    finally:
        receiver.close()


def test_a_certificate_for_another_name_is_refused(alice, task, tmp_path, settings, dns) -> None:  # type: ignore[no-untyped-def]
    cert, key = _certificate(tmp_path, "someone-else.test")
    settings.TASKDESK_WEBHOOK_CA_FILE = cert
    settings.TASKDESK_WEBHOOK_BACKOFF_SECONDS = settings.TASKDESK_WEBHOOK_BACKOFF_MAX_SECONDS = 60
    receiver = Receiver(tls=(cert, key))
    try:
        dns["hooks.example.test"] = "127.0.0.1"
        url = f"https://hooks.example.test:{receiver.port}/in"
        _, receiver.secret = webhooks.register(client=alice, url=url, events=["task.completed"])
        transitions.complete(task_id=task.pk, result={"content": []})
        webhooks.deliver_due(seconds=5)
        assert receiver.deliveries == []
        attempt = DeliveryAttempt.objects.get()
        assert attempt.status_code is None and "Hostname mismatch" in attempt.error
    finally:
        receiver.close()


def test_an_unreadable_ca_file_is_the_attempts_error_not_the_senders(  # type: ignore[no-untyped-def]
    alice, task, tmp_path, settings, dns
) -> None:
    settings.TASKDESK_WEBHOOK_CA_FILE = str(tmp_path / "missing.pem")
    settings.TASKDESK_WEBHOOK_BACKOFF_SECONDS = settings.TASKDESK_WEBHOOK_BACKOFF_MAX_SECONDS = 60
    dns["hooks.example.test"] = "127.0.0.1"
    webhooks.register(
        client=alice, url="https://hooks.example.test:9/in", events=["task.completed"]
    )
    transitions.complete(task_id=task.pk, result={"content": []})
    assert webhooks.deliver_due(seconds=5) == 0
    attempt = DeliveryAttempt.objects.get()
    assert attempt.status_code is None and attempt.error.startswith("FileNotFoundError")
    assert OutboxMessage.objects.get().delivered_at is None  # retried later


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_held_messages_are_skipped_by_another_sender_and_free_again_when_the_holder_stops(
    alice, receiver
) -> None:  # type: ignore[no-untyped-def]
    """On PostgreSQL a sender holds its batch by row locks, not by a lease written to each
    row: another sender skips it, and a holder that ends without recording an attempt (it
    failed, or its process died and its connection closed) leaves it due at once."""
    _endpoint(alice, receiver, ["task.completed"])
    _completed(alice, 3)
    [ids] = outbox.choose("webhook", limit=10).values()
    due_before = set(OutboxMessage.objects.values_list("due_at", flat=True))
    held, done = threading.Event(), threading.Event()

    def holder() -> None:
        try:
            with outbox.holding("webhook", ids, lease_seconds=600) as taken:
                assert len(taken) == 3
                held.set()
                done.wait(10)
                raise RuntimeError("the sender stops here")
        except RuntimeError:
            pass
        finally:
            __import__("django.db").db.connections.close_all()

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert held.wait(10)
        with outbox.holding("webhook", ids, lease_seconds=600) as taken:
            assert taken == []
    finally:
        done.set()
        thread.join(10)
    assert set(OutboxMessage.objects.values_list("due_at", flat=True)) == due_before
    assert webhooks.deliver_due(seconds=5) == 3
    assert len(receiver.deliveries) == 3


def test_a_slow_endpoints_batch_starts_messages_for_a_bounded_time_and_leaves_the_rest_due(
    alice, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """A batch's hold is an open transaction on PostgreSQL: it starts messages only for
    ``_STARTS_SECONDS``, and what it did not start is due for the next claim."""
    monkeypatch.setattr(webhooks, "_STARTS_SECONDS", 0.5)
    receiver = Receiver(hold_each=0.3)
    try:
        _endpoint(alice, receiver, ["task.completed"])
        _completed(alice, 6)
        [ids] = outbox.choose("webhook", limit=10).values()
        # Each answer takes 0.3 s: within 0.5 s one to three are started, not all six.
        sent = webhooks._send_batch(ids, webhooks.lease_seconds())
        assert 1 <= sent <= 3 and len(receiver.deliveries) == sent
        left = OutboxMessage.objects.filter(delivered_at__isnull=True)
        assert left.count() == 6 - sent and all(m.due_at <= timezone.now() for m in left)
    finally:
        receiver.close()
