"""Sending the messages of ``elicitations.notices``: emails through Django's email backend
(``EMAIL_URL``; the embedded default writes them to ``var/mail/``) and posts to a tenant's
Slack-compatible chat webhook (``{"text": ...}``).

``send_due`` (the control job ``send_notices_job``) takes due messages of the two channels
from the outbox with a lease (``outbox.claim``), as the webhook sender does. Each message's
text is built at its first attempt and kept (``outbox.fix_body``), so a retry sends the same
words. A question that is no longer pending, or a person who turned messages off since, is
not sent to (the message is given up with the reason). A failed attempt is recorded and
tried again with the webhooks' backoff (``webhooks.backoff_seconds``) until the question's
deadline, or ``TASKDESK_WEBHOOK_RETRY_HOURS``, whichever comes first; a message given up
after failing writes ``notice_undelivered`` on its task's timeline.

A chat post goes through ``outbound.post``: the same checks of where it may go (https,
public addresses), short timeouts and no redirects.
"""

from __future__ import annotations

import json
import logging
import smtplib
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.mail import EmailMessage, get_connection
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from elicitations import notices
from elicitations.models import InputRequest, TenantChat
from tasks_app import outbound, outbox, webhooks
from tasks_app.models import Actor, Channel, EventKind, OutboxMessage, Task, event

log = logging.getLogger(__name__)

_BATCH = 50


def answer_url(request: InputRequest) -> str:
    """The absolute link to REQUEST's answer page (``TASKDESK_PUBLIC_URL``)."""
    path = reverse("elicitations:answer", args=[request.pk])
    return settings.TASKDESK_PUBLIC_URL.rstrip("/") + path


def settings_url() -> str:
    return settings.TASKDESK_PUBLIC_URL.rstrip("/") + reverse("elicitations:notice_settings")


def _deadline(request: InputRequest) -> str:
    if request.deadline is None:
        return "none"
    return request.deadline.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def compose(message: OutboxMessage, request: InputRequest) -> dict[str, str]:
    """The subject and text of MESSAGE about REQUEST."""
    task = request.task
    reminder = message.kind == notices.REMINDER
    subject = (
        f"{'Reminder: a' if reminder else 'A'} question of {task.tool_name} waits for an answer"
    )
    lines = [
        "Reminder: half the time to answer has passed." if reminder else "A task needs an answer.",
        "",
        f"Tool:     {task.tool_name}",
        f"Task:     {task.pk} (client {task.client.name}, tenant {task.client.tenant.slug})",
        f"Question: {request.message}",
        f"Deadline: {_deadline(request)}",
        "",
        f"Answer it: {answer_url(request)}",
    ]
    if message.channel == Channel.EMAIL:
        lines += [
            "",
            "You are told because you answer questions in this tenant. "
            f"Turn these messages off: {settings_url()}",
        ]
    return {"subject": subject, "text": "\n".join(lines)}


class NotSent(Exception):
    """An attempt that failed: its error in words, and the HTTP status of a chat's answer."""

    def __init__(self, error: str, status_code: int | None = None) -> None:
        super().__init__(error)
        self.status_code = status_code


def _send_email(message: OutboxMessage, body: dict[str, str], connection: Any) -> None:
    email = EmailMessage(
        subject=body["subject"],
        body=body["text"],
        to=[message.recipient],
        connection=connection,
        headers={"Message-ID": f"<{message.message_id}@taskdesk>"},
    )
    try:
        email.send()
    except (smtplib.SMTPException, OSError) as exc:
        raise NotSent(f"{type(exc).__name__}: {exc}") from None


def _post_chat(message: OutboxMessage, body: dict[str, str]) -> int | None:
    chat = TenantChat.objects.filter(pk=message.detail.get("chat"), enabled=True).first()
    if chat is None:
        raise NotSent("the chat webhook is disabled or gone")
    payload = json.dumps({"text": body["text"]}, ensure_ascii=False)
    answer = outbound.post(chat.webhook_url, payload, {})
    if not answer.ok:
        raise NotSent(answer.error or f"HTTP {answer.status_code}", answer.status_code)
    return answer.status_code


def _why_not(message: OutboxMessage, request: InputRequest | None) -> str:
    """Why MESSAGE is no longer to be sent ("" when it is)."""
    if request is None:
        return "not sent: the question is gone"
    if not request.is_pending:
        return f"not sent: the question was {request.status} first"
    user = message.detail.get("user")
    if message.channel == Channel.EMAIL and user is not None and not notices.messages_on(user):
        return "not sent: the person turned messages off"
    return ""


def deliver(message: OutboxMessage, connection: Any) -> bool:
    """One attempt at MESSAGE (taken with ``outbox.claim``); True if it was sent."""
    now = timezone.now()
    request = (
        InputRequest.objects.select_related("task__client__tenant")
        .filter(pk=message.detail.get("request"))
        .first()
    )
    why = _why_not(message, request)
    if why or request is None:
        outbox.give_up(message, reason=why, now=now)
        return False
    text = message.body or outbox.fix_body(message, json.dumps(compose(message, request)))
    body = json.loads(text)
    started = time.monotonic()
    status_code = None
    try:
        if message.channel == Channel.EMAIL:
            _send_email(message, body, connection)
        else:
            status_code = _post_chat(message, body)
        error = ""
    except NotSent as exc:
        error, status_code = str(exc), exc.status_code
    latency = int((time.monotonic() - started) * 1000)
    done = timezone.now()
    outbox.record([outbox.Attempt(message, now, status_code, latency, not error, error)], now=done)
    if not error:
        return True
    log.info("%s %s to %s failed: %s", message.channel, message.message_id,
             message.recipient, error)  # fmt: skip
    after = done + timedelta(seconds=webhooks.backoff_seconds(message.attempts + 1))
    if after > _last_try(message, request):
        _give_up(message, error, now=done)
    else:
        outbox.retry_at(message, after)
    return False


def _last_try(message: OutboxMessage, request: InputRequest) -> datetime:
    window = message.retry_from + timedelta(hours=settings.TASKDESK_WEBHOOK_RETRY_HOURS)
    return min(window, request.deadline) if request.deadline else window


def _give_up(message: OutboxMessage, error: str, *, now: datetime) -> None:
    with transaction.atomic():
        if outbox.give_up(message, reason=error, now=now) and message.task_id:
            event(Task(id=message.task_id), EventKind.NOTICE_UNDELIVERED,
                  actor_type=Actor.SYSTEM, actor="notices", channel=message.channel,
                  notice=message.kind, to=message.detail.get("username") or message.recipient,
                  message_id=message.message_id, error=error)  # fmt: skip
    log.warning("%s %s (%s of task %s) to %s given up: %s", message.channel,
                message.message_id, message.kind, message.task_id, message.recipient, error)  # fmt: skip


def send_due(*, seconds: float) -> int:
    """Send due messages of the email and chat channels for up to SECONDS, one after
    another; return how many were sent."""
    deadline = time.monotonic() + seconds
    lease = 4 * settings.TASKDESK_WEBHOOK_TIMEOUT_SECONDS + 5
    sent = 0
    while time.monotonic() < deadline:
        taken = outbox.claim(Channel.EMAIL, limit=_BATCH, lease_seconds=lease)
        taken += outbox.claim(Channel.CHAT, limit=_BATCH, lease_seconds=lease)
        if not taken:
            break
        held_until = time.monotonic() + lease
        # Not opened here: each send opens and closes it, so a server that is down fails
        # the attempts one by one (recorded, retried) rather than the whole job.
        connection = get_connection(fail_silently=False)
        for message in taken:
            if time.monotonic() + 2 * settings.TASKDESK_WEBHOOK_TIMEOUT_SECONDS > held_until:
                break  # the rest are due again when the lease ends
            sent += deliver(message, connection)
    return sent
