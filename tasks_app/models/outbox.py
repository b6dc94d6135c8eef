"""Webhook endpoints and the outbox of messages, with each delivery attempt."""

from __future__ import annotations

import secrets

from django.db import models
from django.db.models import Q

from tasks_app.models.clients import Client
from tasks_app.models.tasks import Task


class WebhookEvent(models.TextChoices):
    """The events a client's webhook endpoint can subscribe to."""

    TASK_COMPLETED = "task.completed"
    TASK_FAILED = "task.failed"
    TASK_CANCELLED = "task.cancelled"
    TASK_INPUT_REQUIRED = "task.input_required"
    EFFECT_UNKNOWN = "effect.unknown"


class WebhookEndpoint(models.Model):
    """A URL of a client's systems that receives signed webhooks (``tasks_app.webhooks``)
    for the events it subscribes to. The secret (``whsec_`` + base64, the Standard Webhooks
    format) is shown once, when the endpoint is registered; it is kept in the clear because
    every delivery is signed with it. An endpoint that fails for
    ``TASKDESK_WEBHOOK_RETRY_HOURS`` is disabled (``enabled`` false, ``disabled_at``)."""

    client = models.ForeignKey(Client, on_delete=models.CASCADE, related_name="webhook_endpoints")
    url = models.URLField(max_length=2000)
    events = models.JSONField(default=list, help_text="The event types it receives")
    secret = models.CharField(max_length=200, editable=False)
    description = models.CharField(max_length=200, blank=True)
    enabled = models.BooleanField(default=True)
    # Since when every delivery failed (cleared by a success): disabled past the retry window.
    failing_since = models.DateTimeField(null=True, blank=True)
    disabled_at = models.DateTimeField(null=True, blank=True)
    disabled_reason = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            # The look of every transition for an endpoint of the task's client.
            models.Index(
                fields=["client"], condition=Q(enabled=True), name="webhook_enabled_client"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.url} ({self.client})"


class Channel(models.TextChoices):
    """How an outbox message leaves: a webhook to a client's endpoint, or a message to the
    people who answer a question (``elicitations.notices``): an email to one person, or a
    post to a tenant's chat webhook."""

    WEBHOOK = "webhook"
    EMAIL = "email"
    CHAT = "chat"


def new_message_id() -> str:
    # The Standard Webhooks ``webhook-id``: the same for every delivery of one message.
    return "msg_" + secrets.token_hex(16)


class OutboxMessage(models.Model):
    """One message to send to the outside world, written in the transaction of what it
    reports (``tasks_app.outbox``) and sent at least once afterwards by a control job, with
    retries. ``due_at`` is when it is next tried; a sender that takes it moves ``due_at``
    past its lease, so a sender killed in the middle leaves it due again when the lease ends.

    ``channel`` says where it goes: for a webhook, ``endpoint``; ``recipient`` is for
    channels that address a person. ``kind`` is the event type; ``detail`` what the writer
    knew that the task does not say; ``body`` the exact bytes sent, fixed at the first
    attempt so that every delivery of the message is the same (and signed the same way).
    Neither foreign key is checked by the database (written beside its task, like
    ``Dispatch``); deleting a task or an endpoint deletes its messages (Django)."""

    channel = models.CharField(max_length=20, choices=Channel.choices)
    kind = models.CharField(max_length=100)
    message_id = models.CharField(max_length=64, unique=True, default=new_message_id)
    task = models.ForeignKey(
        Task,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="outbox_messages",
        db_constraint=False,
        db_index=False,
    )
    endpoint = models.ForeignKey(
        WebhookEndpoint,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="messages",
        db_constraint=False,
        db_index=False,
    )
    recipient = models.CharField(max_length=300, blank=True)
    detail = models.JSONField(default=dict, blank=True)
    body = models.TextField(null=True, blank=True)  # noqa: DJ001 (NULL: not built yet)
    created_at = models.DateTimeField()
    # Retries end this long after retry_from (created_at, or a "send again").
    retry_from = models.DateTimeField()
    due_at = models.DateTimeField()
    attempts = models.IntegerField(default=0)
    delivered_at = models.DateTimeField(null=True, blank=True)
    gave_up_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True)

    class Meta:
        indexes = [
            # The senders' claim: undelivered messages of a channel, by when they are due.
            models.Index(
                fields=["channel", "due_at"],
                condition=Q(delivered_at__isnull=True, gave_up_at__isnull=True),
                name="outbox_due",
            ),
            models.Index(fields=["task"], name="outbox_task"),
            models.Index(fields=["endpoint", "-created_at"], name="outbox_endpoint_recent"),
        ]

    def __str__(self) -> str:
        return f"{self.channel} {self.kind} {self.message_id}"

    @property
    def state(self) -> str:
        if self.delivered_at:
            return "delivered"
        if self.gave_up_at:
            return "gave up"
        return "retrying" if self.attempts else "pending"


class DeliveryAttempt(models.Model):
    """One try at sending an outbox message: when, the HTTP status (None if no answer),
    how long it took and what went wrong."""

    message = models.ForeignKey(OutboxMessage, on_delete=models.CASCADE, related_name="tries")
    started_at = models.DateTimeField()
    status_code = models.IntegerField(null=True, blank=True)
    latency_ms = models.IntegerField(default=0)
    ok = models.BooleanField(default=False)
    error = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["started_at", "id"]

    def __str__(self) -> str:
        return f"attempt of {self.message_id} at {self.started_at}"
