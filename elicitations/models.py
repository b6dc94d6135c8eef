"""Questions a running task asks, and their answers. Changes go through ``transitions``."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q


class Mode(models.TextChoices):
    FORM = "form"
    URL = "url"


class Audience(models.TextChoices):
    CLIENT = "client"
    OPERATOR = "operator"
    ANY = "any"


class RequestStatus(models.TextChoices):
    PENDING = "pending"
    ANSWERED = "answered"
    DECLINED = "declined"
    CANCELLED = "cancelled"
    EXPIRED = "expired"


class Channel(models.TextChoices):
    TASKS_UPDATE = "tasks/update"
    MRTR_RETRY = "mrtr"
    INBOX = "inbox"
    LEGACY_ELICIT = "elicitation/create"
    DEADLINE = "deadline"


class OnTimeout(models.TextChoices):
    DECLINE = "decline"
    DEFAULT = "default"
    FAIL = "fail"


class InputRequest(models.Model):
    task = models.ForeignKey(
        "tasks_app.Task", on_delete=models.CASCADE, related_name="input_requests"
    )
    # Server-minted, unique over the task's whole lifetime (never reused once answered).
    key = models.CharField(max_length=100)
    # The tool's own name for the question (ctx.ask(key=...)), used by the journal.
    ask_key = models.CharField(max_length=200)
    mode = models.CharField(max_length=10, choices=Mode.choices, default=Mode.FORM)
    message = models.TextField()
    requested_schema = models.JSONField(null=True, blank=True)
    # The schema's property names in the order the tool wrote them: PostgreSQL's jsonb keeps
    # object keys in its own order, and forms list their fields in this one (``form_schema``).
    property_order = models.JSONField(default=list, blank=True)
    url = models.URLField(max_length=2000, blank=True)
    audience = models.CharField(max_length=10, choices=Audience.choices, default=Audience.CLIENT)
    status = models.CharField(
        max_length=10, choices=RequestStatus.choices, default=RequestStatus.PENDING
    )
    answer = models.JSONField(null=True, blank=True)
    answered_by_client = models.ForeignKey(
        "tasks_app.Client", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    answered_by_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    channel = models.CharField(max_length=30, choices=Channel.choices, blank=True)
    answered_at = models.DateTimeField(null=True, blank=True)
    deadline = models.DateTimeField(null=True, blank=True)
    on_timeout = models.CharField(
        max_length=10, choices=OnTimeout.choices, default=OnTimeout.DECLINE
    )
    default_answer = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # When the people told of a question waiting in the inbox are reminded of it (half way to
    # its deadline); cleared by the reminder job when it writes the reminders
    # (``elicitations.notices``, the one writer). NULL: no reminder (due).
    remind_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["task", "key"], name="inputrequest_unique_task_key"),
            models.CheckConstraint(
                condition=Q(status__in=RequestStatus.values), name="inputrequest_status_valid"
            ),
        ]
        indexes = [
            # The inbox (pending, by deadline) and the deadline sweeper.
            models.Index(
                fields=["deadline", "created_at"],
                condition=Q(status="pending"),
                name="inputrequest_pending",
            ),
            # The reminder job's scan (notices.remind_due): pending questions with a reminder.
            models.Index(
                fields=["remind_at"],
                condition=Q(status="pending", remind_at__isnull=False),
                name="inputrequest_remind",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.key} ({self.status})"

    @property
    def form_schema(self) -> dict[str, Any] | None:
        """The requested schema with its properties in the order the tool asked them."""
        schema = self.requested_schema
        if not isinstance(schema, dict) or not isinstance(schema.get("properties"), dict):
            return schema
        properties = schema["properties"]
        names = [n for n in self.property_order if n in properties]
        names += [n for n in properties if n not in names]
        return {**schema, "properties": {name: properties[name] for name in names}}

    @property
    def is_pending(self) -> bool:
        return self.status == RequestStatus.PENDING

    @property
    def answered_by(self) -> str:
        """Who settled the request, for people: an operator, a client, or the deadline."""
        if self.answered_by_user is not None:
            return self.answered_by_user.get_username()
        if self.answered_by_client is not None:
            return self.answered_by_client.name
        if self.channel == Channel.DEADLINE:
            return "the deadline"
        return ""

    @property
    def action(self) -> str:
        """The answer's action (accept, decline or cancel), or "" while none was given."""
        return str((self.answer or {}).get("action", ""))


# --- messages to the people who answer (elicitations.notices) -----------------------------------


class NoticePreference(models.Model):
    """Whether a person is sent messages about questions waiting for them (their settings
    page). No row: they are (the default)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        primary_key=True,
        related_name="notice_preference",
    )
    enabled = models.BooleanField(default=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"messages {'on' if self.enabled else 'off'} for {self.user}"


class TenantChat(models.Model):
    """A tenant's Slack-compatible incoming webhook: questions waiting for its operators are
    posted there too (``{"text": ...}``). The URL is a secret of the chat's: it is shown in
    the admin only."""

    tenant = models.OneToOneField("tasks_app.Tenant", on_delete=models.CASCADE, related_name="chat")
    webhook_url = models.URLField(
        max_length=2000,
        help_text="The incoming webhook's URL (https; a Slack-compatible JSON POST)",
    )
    enabled = models.BooleanField(default=True)

    class Meta:
        verbose_name = "chat webhook"

    def __str__(self) -> str:
        return f"chat of {self.tenant}"


class QuestionRoute(models.Model):
    """Who of a tenant is told of a tool's questions: the members of GROUP and the chosen
    MEMBERS, instead of every answerer of the tenant. Only people who may answer in the
    tenant are told either way."""

    tenant = models.ForeignKey(
        "tasks_app.Tenant", on_delete=models.CASCADE, related_name="question_routes"
    )
    tool_name = models.CharField(max_length=200, help_text="The tool whose questions this routes")
    group = models.ForeignKey(
        "auth.Group", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="+")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "tool_name"], name="questionroute_unique")
        ]

    def __str__(self) -> str:
        return f"questions of {self.tool_name} in {self.tenant}"
