"""Messages to the people who must answer: who is told of a question waiting in the inbox,
the messages written for them, and the reminder half way to its deadline.

When a question waits for operators (audience ``operator`` or ``any``), ``announce`` writes,
in the transaction that opens it (``transitions.open_request``), one outbox message
(``tasks_app.outbox``) per person to tell (channel ``email``) and one for the tenant's chat
webhook when it has one (channel ``chat``). Nothing is sent inside the transaction: the
control job ``send_notices_job`` sends them afterwards (``elicitations.sending``), with retries.

Who is told (``recipients``): the active members of the task's tenant who may answer there,
who have an email address and did not turn messages off (``NoticePreference``). A tenant can
narrow a tool's questions to a group or chosen members (``QuestionRoute``).

The reminder: a question that waits for operators gets ``remind_at`` half way between its
opening and its deadline. ``remind_due`` (the control job ``remind_input_requests_job``)
takes the questions still pending past it (compare-and-set, so a reminder is written once),
clears it and writes the reminders, to the people who are to be told at that moment.

``told`` lists the messages about a question and what became of each: the deadline's
timeline entry carries it.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from elicitations.models import (
    Audience,
    InputRequest,
    NoticePreference,
    QuestionRoute,
    RequestStatus,
    TenantChat,
)
from tasks_app import operators, outbox
from tasks_app.models import Channel, OutboxMessage, Task

# The outbox kinds of the two messages a question can give.
WAITING = "question.waiting"
REMINDER = "question.reminder"
KINDS = (WAITING, REMINDER)


def waits_for_operators(audience: str) -> bool:
    """Whether a question routed to AUDIENCE waits in the inbox (and people are told)."""
    return audience in (Audience.OPERATOR, Audience.ANY)


def remind_at(opened: datetime, deadline: datetime | None) -> datetime | None:
    """Half way from OPENED to DEADLINE (None: no deadline, or one already passed)."""
    if deadline is None or deadline <= opened:
        return None
    return opened + (deadline - opened) / 2


def messages_on(user_id: int) -> bool:
    """Whether the user wants messages (no preference row: yes)."""
    return not NoticePreference.objects.filter(user=user_id, enabled=False).exists()


def set_messages(user_id: int, *, enabled: bool) -> None:
    NoticePreference.objects.update_or_create(user_id=user_id, defaults={"enabled": enabled})


def recipients(*, tenant_id: int, tool_name: str) -> list[Any]:
    """The people to tell of a question of TOOL_NAME in the tenant: its active members who
    may answer there, have an email address and want messages, narrowed to the tool's route
    (a group and chosen members) when the tenant has one. Ordered by username."""
    users = (
        get_user_model()
        .objects.filter(is_active=True, memberships__tenant_id=tenant_id)
        .exclude(email="")
        .exclude(notice_preference__enabled=False)
        .distinct()
        .order_by("username")
    )
    route = QuestionRoute.objects.filter(tenant_id=tenant_id, tool_name=tool_name).first()
    if route is not None:
        chosen = Q(pk__in=route.members.values("pk"))
        if route.group_id is not None:
            chosen |= Q(groups=route.group_id)
        users = users.filter(chosen)
    return [u for u in users if operators.may(u, operators.ANSWER_QUESTIONS, tenant_id)]


def _write(
    request: InputRequest, task: Task, kind: str, people: Iterable[Any], now: datetime
) -> int:
    base = {"request": request.pk, "key": request.key}
    written = outbox.write_to(
        Channel.EMAIL,
        kind,
        task_id=task.pk,
        to=[
            (person.email, {**base, "user": person.pk, "username": person.get_username()})
            for person in people
        ],
        now=now,
    )
    chat = TenantChat.objects.filter(tenant_id=task.client.tenant_id, enabled=True).first()
    if chat is not None:
        written += outbox.write_to(
            Channel.CHAT,
            kind,
            task_id=task.pk,
            to=[(f"chat of {task.client.tenant.slug}", {**base, "chat": chat.pk})],
            now=now,
        )
    return written


def announce(request: InputRequest, task: Task) -> int:
    """In the transaction that opens REQUEST (waiting for operators): the messages telling
    the people to tell, and the tenant's chat. Return how many were written."""
    task = Task.objects.select_related("client__tenant").get(pk=task.pk)
    people = recipients(tenant_id=task.client.tenant_id, tool_name=task.tool_name)
    return _write(request, task, WAITING, people, request.created_at or timezone.now())


def remind_due(now: datetime | None = None) -> int:
    """Write the reminders of the questions still pending past their ``remind_at``; return
    how many questions were reminded of. Safe to run twice (each is taken once)."""
    now = now or timezone.now()
    due = list(
        InputRequest.objects.filter(status=RequestStatus.PENDING, remind_at__lte=now)
        .order_by("remind_at")
        .values_list("pk", flat=True)
    )
    return sum(_remind_one(pk, now) for pk in due)


@transaction.atomic
def _remind_one(request_id: int, now: datetime) -> bool:
    taken = InputRequest.objects.filter(
        pk=request_id, status=RequestStatus.PENDING, remind_at__isnull=False
    ).update(remind_at=None)
    if not taken:
        return False  # answered, or reminded by another run, since the scan
    request = InputRequest.objects.select_related("task__client__tenant").get(pk=request_id)
    task = request.task
    people = recipients(tenant_id=task.client.tenant_id, tool_name=task.tool_name)
    _write(request, task, REMINDER, people, now)
    return True


def messages_about(request: InputRequest) -> list[OutboxMessage]:
    """The messages written about REQUEST, oldest first."""
    return [
        m
        for m in OutboxMessage.objects.filter(
            task_id=request.task_id, channel__in=(Channel.EMAIL, Channel.CHAT), kind__in=KINDS
        ).order_by("created_at", "pk")
        if m.detail.get("request") == request.pk
    ]


def told(request: InputRequest) -> list[dict[str, Any]]:
    """Who was told of REQUEST and when: for each message its kind, channel, to whom
    (username, or the chat), and when it was delivered or what became of it."""
    lines = []
    for message in messages_about(request):
        line: dict[str, Any] = {
            "kind": message.kind,
            "channel": message.channel,
            "to": message.detail.get("username") or message.recipient,
            "written_at": message.created_at.isoformat(),
        }
        if message.delivered_at is not None:
            line["delivered_at"] = message.delivered_at.isoformat()
        elif message.gave_up_at is not None:
            line["not_delivered"] = message.last_error
        else:
            line["pending"] = message.last_error or "not sent yet"
        lines.append(line)
    return lines
