"""Who is told of a question waiting in the inbox, the messages written in the transaction
that opens it, and the reminder half way to its deadline (``elicitations.notices``)."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.contrib.auth.models import Group
from django.utils import timezone

from elicitations import notices, transitions
from elicitations.models import InputRequest, QuestionRoute, TenantChat
from tasks_app.models import Channel, EventKind, OutboxMessage
from tasks_app.operators import grant_role


@pytest.fixture
def person(alice, django_user_model):  # type: ignore[no-untyped-def]
    """person(name, role) makes a member of alice's tenant with ROLE and an email address."""

    def make(name: str, role: str = "answerer", email: str | None = None):  # type: ignore[no-untyped-def]
        user = django_user_model.objects.create_user(
            username=name, email=f"{name}@example.com" if email is None else email
        )
        alice.tenant.members.add(user)
        grant_role(user, role, alice.tenant)
        return user

    return make


def emails() -> dict[str, OutboxMessage]:
    return {m.recipient: m for m in OutboxMessage.objects.filter(channel=Channel.EMAIL)}


def test_it_writes_one_email_per_answerer_and_operator(ask, person, django_user_model) -> None:  # type: ignore[no-untyped-def]
    person("anna")
    person("olga", "operator")
    person("vera", "viewer")
    person("nomail", email="")
    person("quiet")
    notices.set_messages(django_user_model.objects.get(username="quiet").pk, enabled=False)
    django_user_model.objects.create_user(username="oscar", email="oscar@example.com")

    request = ask()

    written = emails()
    assert sorted(written) == ["anna@example.com", "olga@example.com"]
    anna = written["anna@example.com"]
    assert anna.kind == notices.WAITING
    assert anna.task_id == request.task_id
    assert anna.detail["request"] == request.pk
    assert anna.detail["username"] == "anna"
    assert anna.due_at <= timezone.now()


def test_it_writes_nothing_for_a_question_of_the_client(ask, person) -> None:  # type: ignore[no-untyped-def]
    person("anna")
    request = ask(audience="client")
    assert OutboxMessage.objects.count() == 0
    assert request.remind_at is None


def test_a_question_any_party_may_answer_is_announced(ask, person) -> None:  # type: ignore[no-untyped-def]
    person("anna")
    ask(audience="any")
    assert list(emails()) == ["anna@example.com"]


def test_nothing_is_written_when_the_question_is_refused(ask, person, task) -> None:  # type: ignore[no-untyped-def]
    person("anna")
    task.status = "completed"
    task.save()
    with pytest.raises(transitions.TaskClosed):
        ask()
    assert OutboxMessage.objects.count() == 0


def test_a_route_to_a_group_tells_its_members_only(ask, person, alice) -> None:  # type: ignore[no-untyped-def]
    anna = person("anna")
    person("olga", "operator")
    group = Group.objects.create(name="refunds")
    anna.groups.add(group)
    QuestionRoute.objects.create(tenant=alice.tenant, tool_name="refund_payment", group=group)
    ask()
    assert list(emails()) == ["anna@example.com"]


def test_a_route_to_members_tells_them_if_they_may_answer(ask, person, alice) -> None:  # type: ignore[no-untyped-def]
    person("anna")
    olga = person("olga", "operator")
    vera = person("vera", "viewer")
    route = QuestionRoute.objects.create(tenant=alice.tenant, tool_name="refund_payment")
    route.members.add(olga, vera)
    ask()
    assert list(emails()) == ["olga@example.com"]


def test_a_route_of_another_tool_changes_nothing(ask, person, alice) -> None:  # type: ignore[no-untyped-def]
    person("anna")
    QuestionRoute.objects.create(tenant=alice.tenant, tool_name="deploy")
    ask()
    assert list(emails()) == ["anna@example.com"]


def test_the_tenants_chat_gets_one_message(ask, person, alice) -> None:  # type: ignore[no-untyped-def]
    person("anna")
    chat = TenantChat.objects.create(tenant=alice.tenant, webhook_url="https://chat.example.com/h")
    request = ask()
    posted = OutboxMessage.objects.get(channel=Channel.CHAT)
    assert posted.detail == {"request": request.pk, "key": request.key, "chat": chat.pk}
    assert posted.recipient == "chat of acme"


def test_a_disabled_chat_gets_nothing(ask, alice) -> None:  # type: ignore[no-untyped-def]
    TenantChat.objects.create(
        tenant=alice.tenant, webhook_url="https://chat.example.com/h", enabled=False
    )
    ask()
    assert not OutboxMessage.objects.filter(channel=Channel.CHAT).exists()


def test_the_reminder_is_due_half_way_to_the_deadline(ask) -> None:  # type: ignore[no-untyped-def]
    request = ask(deadline=timedelta(hours=2))
    assert request.deadline is not None and request.remind_at is not None
    assert abs((request.deadline - request.remind_at) - timedelta(hours=1)) < timedelta(seconds=1)


def test_the_reminder_is_written_once_past_half_way(ask, person) -> None:  # type: ignore[no-untyped-def]
    person("anna")
    request = ask(deadline=timedelta(hours=2))
    assert notices.remind_due() == 0
    with time_machine.travel(timezone.now() + timedelta(minutes=61), tick=False):
        assert notices.remind_due() == 1
        assert notices.remind_due() == 0
    reminders = OutboxMessage.objects.filter(kind=notices.REMINDER)
    assert [m.recipient for m in reminders] == ["anna@example.com"]
    request.refresh_from_db()
    assert request.remind_at is None


def test_an_answered_question_is_not_reminded_of(ask, person, operator) -> None:  # type: ignore[no-untyped-def]
    person("anna")
    request = ask(deadline=timedelta(hours=2))
    transitions.answer(
        task=request.task,
        key=request.key,
        response={"action": "decline"},
        channel="inbox",
        user=operator,
    )
    with time_machine.travel(timezone.now() + timedelta(minutes=61), tick=False):
        assert notices.remind_due() == 0
    assert not OutboxMessage.objects.filter(kind=notices.REMINDER).exists()


def test_the_reminder_skips_who_turned_messages_off_since(ask, person) -> None:  # type: ignore[no-untyped-def]
    anna = person("anna")
    person("olga", "operator")
    ask(deadline=timedelta(hours=2))
    notices.set_messages(anna.pk, enabled=False)
    with time_machine.travel(timezone.now() + timedelta(minutes=61), tick=False):
        notices.remind_due()
    reminders = OutboxMessage.objects.filter(kind=notices.REMINDER)
    assert [m.recipient for m in reminders] == ["olga@example.com"]


def test_the_deadline_entry_says_who_was_told_and_when(ask, person, task) -> None:  # type: ignore[no-untyped-def]
    person("anna")
    person("olga", "operator")
    request = ask(deadline=timedelta(minutes=10))
    anna = OutboxMessage.objects.get(recipient="anna@example.com")
    sent_at = timezone.now()
    OutboxMessage.objects.filter(pk=anna.pk).update(delivered_at=sent_at)
    OutboxMessage.objects.filter(recipient="olga@example.com").update(
        gave_up_at=sent_at, last_error="SMTPRecipientsRefused"
    )
    with time_machine.travel(timezone.now() + timedelta(minutes=11), tick=False):
        assert transitions.expire_overdue() == 1
    expired = task.events.get(kind=EventKind.INPUT_EXPIRED)
    told = {line["to"]: line for line in expired.detail["told"]}
    assert told["anna"]["delivered_at"] == sent_at.isoformat()
    assert told["anna"]["channel"] == "email" and told["anna"]["kind"] == notices.WAITING
    assert told["olga"]["not_delivered"] == "SMTPRecipientsRefused"
    assert InputRequest.objects.get(pk=request.pk).status == "expired"
