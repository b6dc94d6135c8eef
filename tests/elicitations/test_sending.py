"""Sending the messages to the people who answer (``elicitations.sending``): email through
Django's backend (a local SMTP server here), a tenant's chat webhook (a local receiver), the
retries, and what is not sent."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta

import pytest
import time_machine
from django.core import mail
from django.urls import reverse
from django.utils import timezone

from elicitations import notices, sending, transitions
from elicitations.models import TenantChat
from tasks_app import webhooks
from tasks_app.models import Channel, DeliveryAttempt, EventKind, OutboxMessage
from tasks_app.operators import grant_role
from tests.mail_server import MailServer
from tests.webhook_receiver import Receiver

PUBLIC = "https://desk.example.com"


@pytest.fixture(autouse=True)
def _public_url(settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_PUBLIC_URL = PUBLIC
    settings.TASKDESK_WEBHOOK_BACKOFF_SECONDS = 1
    settings.TASKDESK_WEBHOOK_BACKOFF_MAX_SECONDS = 2


@pytest.fixture
def person(alice, django_user_model):  # type: ignore[no-untyped-def]
    def make(name: str, role: str = "answerer"):  # type: ignore[no-untyped-def]
        user = django_user_model.objects.create_user(username=name, email=f"{name}@example.com")
        alice.tenant.members.add(user)
        grant_role(user, role, alice.tenant)
        return user

    return make


@pytest.fixture
def smtp(settings) -> Iterator[MailServer]:  # type: ignore[no-untyped-def]
    server = MailServer()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", server.port
    settings.EMAIL_USE_TLS = settings.EMAIL_USE_SSL = False
    settings.EMAIL_HOST_USER = settings.EMAIL_HOST_PASSWORD = ""
    settings.EMAIL_TIMEOUT = 5
    yield server
    server.close()


def test_each_answerer_gets_a_message_that_names_the_question(ask, person) -> None:  # type: ignore[no-untyped-def]
    person("anna")
    person("olga", "operator")
    request = ask(deadline=timedelta(hours=1))

    assert sending.send_due(seconds=5) == 2

    assert sorted(m.to[0] for m in mail.outbox) == ["anna@example.com", "olga@example.com"]
    message = mail.outbox[0]
    assert message.subject == "A question of refund_payment waits for an answer"
    assert f"Task:     {request.task_id} (client alice, tenant acme)" in message.body
    assert "Question: Approve a refund of 200.00?" in message.body
    assert f"Deadline: {request.deadline.strftime('%Y-%m-%d %H:%M:%S')} UTC" in message.body
    assert f"Answer it: {PUBLIC}/inbox/{request.pk}/" in message.body
    assert f"{PUBLIC}/settings/" in message.body
    assert OutboxMessage.objects.filter(delivered_at__isnull=False).count() == 2
    assert sending.send_due(seconds=1) == 0  # sent once


def test_it_sends_through_an_smtp_server(ask, person, smtp) -> None:  # type: ignore[no-untyped-def]
    person("anna")
    request = ask()
    assert sending.send_due(seconds=5) == 1
    [received] = smtp.to("anna@example.com")
    assert received.subject == "A question of refund_payment waits for an answer"
    assert f"{PUBLIC}/inbox/{request.pk}/" in received.text
    message = OutboxMessage.objects.get()
    assert received.message["Message-ID"] == f"<{message.message_id}@taskdesk>"


def test_a_refusing_server_is_tried_again_with_the_same_words(ask, person, smtp) -> None:  # type: ignore[no-untyped-def]
    person("anna")
    ask()
    smtp.refuse = True
    assert sending.send_due(seconds=5) == 0
    message = OutboxMessage.objects.get()
    assert message.attempts == 1 and message.delivered_at is None and message.gave_up_at is None
    assert "451" in message.last_error
    assert message.due_at > timezone.now()
    body = message.body
    smtp.refuse = False
    with time_machine.travel(timezone.now() + timedelta(seconds=5), tick=False):
        assert sending.send_due(seconds=5) == 1
    message.refresh_from_db()
    assert message.body == body and message.delivered_at is not None
    assert DeliveryAttempt.objects.filter(message=message).count() == 2
    assert len(smtp.to("anna@example.com")) == 1


def test_a_send_failing_until_the_deadline_is_given_up_on_the_timeline(  # type: ignore[no-untyped-def]
    ask, person, smtp, task, client, operator
) -> None:
    person("anna")
    ask(deadline=timedelta(seconds=2))
    smtp.refuse = True
    sending.send_due(seconds=5)
    with time_machine.travel(timezone.now() + timedelta(seconds=3), tick=False):
        OutboxMessage.objects.update(due_at=timezone.now())
        sending.send_due(seconds=5)
    message = OutboxMessage.objects.get(recipient="anna@example.com")
    assert message.gave_up_at is not None
    undelivered = task.events.get(kind=EventKind.NOTICE_UNDELIVERED)
    assert undelivered.detail["to"] == "anna" and "451" in undelivered.detail["error"]
    client.force_login(operator)
    page = client.get(reverse("task_detail", args=[task.pk])).content.decode()
    assert "email to anna@example.com" in page
    assert "notice_undelivered" in page
    assert "gave up" in page


def test_nothing_is_sent_to_who_turned_messages_off_since(ask, person) -> None:  # type: ignore[no-untyped-def]
    anna = person("anna")
    ask()
    notices.set_messages(anna.pk, enabled=False)
    assert sending.send_due(seconds=5) == 0
    assert mail.outbox == []
    assert OutboxMessage.objects.get().last_error == "not sent: the person turned messages off"


def test_nothing_is_sent_about_a_question_answered_first(ask, person, operator) -> None:  # type: ignore[no-untyped-def]
    person("anna")
    request = ask()
    transitions.answer(
        task=request.task,
        key=request.key,
        response={"action": "decline"},
        channel="inbox",
        user=operator,
    )
    sending.send_due(seconds=5)
    assert [m.to for m in mail.outbox] == []
    assert set(OutboxMessage.objects.values_list("last_error", flat=True)) == {
        "not sent: the question was declined first"
    }


def test_the_reminder_says_so(ask, person) -> None:  # type: ignore[no-untyped-def]
    person("anna")
    ask(deadline=timedelta(hours=2))
    sending.send_due(seconds=5)
    with time_machine.travel(timezone.now() + timedelta(minutes=61), tick=False):
        notices.remind_due()
        assert sending.send_due(seconds=5) == 1
    assert [m.subject for m in mail.outbox] == [
        "A question of refund_payment waits for an answer",
        "Reminder: a question of refund_payment waits for an answer",
    ]
    assert mail.outbox[1].body.startswith("Reminder: half the time to answer has passed.")


@pytest.fixture
def receiver(settings) -> Iterator[Receiver]:  # type: ignore[no-untyped-def]
    settings.TASKDESK_WEBHOOK_ALLOW_HTTP_LOOPBACK = True
    running = Receiver(secret=webhooks.new_secret())  # chat posts are not signed
    yield running
    running.close()


def test_the_tenants_chat_gets_a_json_text_post(ask, alice, receiver) -> None:  # type: ignore[no-untyped-def]
    TenantChat.objects.create(tenant=alice.tenant, webhook_url=receiver.url)
    request = ask()
    assert sending.send_due(seconds=5) == 1
    [posted] = receiver.deliveries
    assert list(posted.body) == ["text"]
    assert "Tool:     refund_payment" in posted.body["text"]
    assert f"Answer it: {PUBLIC}/inbox/{request.pk}/" in posted.body["text"]
    assert posted.headers["content-type"] == "application/json"
    message = OutboxMessage.objects.get(channel=Channel.CHAT)
    assert message.delivered_at is not None
    assert json.loads(message.body or "")["text"] == posted.body["text"]


def test_a_failing_chat_is_retried(ask, alice, receiver) -> None:  # type: ignore[no-untyped-def]
    receiver.script = [500]
    TenantChat.objects.create(tenant=alice.tenant, webhook_url=receiver.url)
    ask()
    assert sending.send_due(seconds=5) == 0
    message = OutboxMessage.objects.get(channel=Channel.CHAT)
    assert message.last_error == "HTTP 500"
    with time_machine.travel(timezone.now() + timedelta(seconds=5), tick=False):
        assert sending.send_due(seconds=5) == 1
    assert [d.status for d in receiver.deliveries] == [500, 200]
    assert [a.status_code for a in DeliveryAttempt.objects.order_by("pk")] == [500, 200]
