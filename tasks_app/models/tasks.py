"""The task: its statuses, protocol eras, timeline events and the one way to append one."""

from __future__ import annotations

import secrets
from typing import Any

from django.db import models
from django.db.models import Q

from tasks_app.models.clients import Client


def new_task_id() -> str:
    # 24 bytes from the OS CSPRNG = 192 bits, URL-safe base64 (32 characters), never starting
    # with "-": a command line (`manage.py tasks show <id>`) would take it for an option.
    while (task_id := secrets.token_urlsafe(24)).startswith("-"):
        pass
    return task_id


class Status(models.TextChoices):
    WORKING = "working"
    INPUT_REQUIRED = "input_required"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_STATUSES = frozenset({Status.COMPLETED, Status.FAILED, Status.CANCELLED})
# A task in one of these has not ended (it counts against its client's active-task limit).
ACTIVE_STATUSES = (Status.WORKING, Status.INPUT_REQUIRED)


class Era(models.TextChoices):
    MODERN = "2026-07-28"
    LEGACY = "2025-11-25"


# The MCP tasks extension (SEP-2663): its identifier and capability key.
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
# In ``Task.client_answers``: a 2026-07-28 call that did not declare the tasks extension.
# Whatever elicitation it declared, the client has no ``tasks/update`` to answer with.
NO_TASKS = "no-tasks"


class Task(models.Model):
    id = models.CharField(primary_key=True, max_length=64, default=new_task_id, editable=False)
    # Indexed by task_client_recent (client first), which also serves the foreign key.
    client = models.ForeignKey(
        Client, on_delete=models.CASCADE, related_name="tasks", db_index=False
    )
    tool_name = models.CharField(max_length=200)
    arguments = models.JSONField(default=dict)
    fingerprint = models.CharField(max_length=64, blank=True)
    # NULL (not "") for keyless tasks, so the partial unique constraint skips them.
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.WORKING)
    status_message = models.TextField(blank=True)
    result = models.JSONField(null=True, blank=True)
    # A completed task whose result is a tool error (``isError``), written with the result
    # (``transitions.complete``): the console filters and counts these apart from plain
    # completions without reading the JSON of every row.
    is_error = models.BooleanField(default=False, db_default=False)
    error = models.JSONField(null=True, blank=True)
    era = models.CharField(max_length=16, choices=Era.choices, default=Era.MODERN)
    # How the calling client can answer the task's questions, as its call declared it: the
    # elicitation modes ("form", "url") and NO_TASKS, space-separated ("" for none). Read
    # when a question is opened (``elicitations.routing``). NULL: not recorded (a task
    # accepted before this column existed, or made outside an MCP call): the client is taken
    # to answer every mode, as before.
    client_answers = models.CharField(max_length=20, null=True, blank=True)  # noqa: DJ001
    ttl_ms = models.BigIntegerField(null=True, blank=True)
    poll_interval_ms = models.IntegerField(default=1000)
    # Runtime bookkeeping: the current leg's lease, and how many legs have started.
    leg = models.IntegerField(default=0)
    lease_owner = models.CharField(max_length=200, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True, db_index=True)
    # The bytes the task keeps, as compact JSON: its arguments (written on acceptance), the
    # answers to its questions (as each is recorded), and its result, error and status
    # message once it ends (in the statement that ends it).
    # Summed per client for TASKDESK_MAX_STORED_BYTES_PER_CLIENT (``tasks_app.storage``).
    stored_bytes = models.BigIntegerField(default=0)
    # "Run again": the finished task this one runs again (tasks_app.rerun), and so the
    # original's ``reruns``. Indexed by task_rerun_of (few tasks have one).
    rerun_of = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="reruns",
        db_index=False,
    )

    class Meta:
        constraints = [
            # Decides concurrent submissions with the same key: the loser's INSERT fails and
            # it reads the winner's row (acceptance.accept). No read-then-insert race.
            models.UniqueConstraint(
                fields=["client", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="task_unique_client_idempotency_key",
            ),
            models.CheckConstraint(condition=Q(status__in=Status.values), name="task_status_valid"),
        ]
        indexes = [
            # The dashboard's list (tasks_app.listing.task_page_for_operator): newest first (or
            # oldest, scanned backwards), read by keyset on (created_at, id), unfiltered, by
            # status, by tool, by client; the second and third also serve the list sorted by
            # status and by tool (then newest first), and the third the tool pick list (one
            # probe per name: selectors.tool_names). The first also serves the throughput
            # chart's "accepted per minute".
            models.Index(fields=["-created_at", "-id"], name="task_recent"),
            # client_id and tool_name are carried in the status index so a tenant's count per
            # status, within a tool filter or not, is an index-only scan
            # (listing.task_counts_for_operator).
            models.Index(
                fields=["status", "-created_at", "-id"],
                include=["client", "tool_name"],
                name="task_status_recent",
            ),
            models.Index(fields=["tool_name", "-created_at", "-id"], name="task_tool_recent"),
            models.Index(fields=["client", "-created_at", "-id"], name="task_client_recent"),
            # The active-task limit counts a client's unfinished tasks (acceptance).
            models.Index(
                fields=["client"],
                condition=Q(status__in=["working", "input_required"]),
                name="task_client_active",
            ),
            # Finished tasks by status and end: the attention list's "failed in the last 24 h"
            # and the throughput chart's "finished per minute".
            models.Index(
                fields=["status", "finished_at"],
                condition=Q(finished_at__isnull=False),
                name="task_finished",
            ),
            # Tool errors only (a few per cent of the tasks): the console's "Tool error" list
            # (newest first) and the attention list's "in the last 24 h"; either counts them
            # by tenant and tool from the index alone.
            models.Index(
                fields=["-created_at", "-id"],
                include=["client", "tool_name"],
                condition=Q(is_error=True),
                name="task_tool_error",
            ),
            models.Index(
                fields=["finished_at"],
                include=["client", "tool_name"],
                condition=Q(is_error=True),
                name="task_tool_error_finished",
            ),
            # Leased tasks only (a running leg, or one undoing a cancelled task's effects): the
            # lease sweeper's expired leases, and the legs each tenant has running (fair
            # claiming, tasks_app.db).
            models.Index(
                fields=["lease_expires_at"],
                condition=Q(lease_expires_at__isnull=False),
                name="task_leased",
            ),
            # A task's reruns (the task page's "ran again as"); NULL for nearly every task.
            models.Index(
                fields=["rerun_of"], condition=Q(rerun_of__isnull=False), name="task_rerun_of"
            ),
            # On PostgreSQL only (migration 0015, not declared here because SQLite cannot build
            # them): trigram indexes for the console's substring search of idempotency keys and
            # status messages (task_key_trgm, task_message_trgm), and the finished tasks by
            # duration (task_duration), for the list sorted by duration.
        ]

    def __str__(self) -> str:
        return f"{self.tool_name} {self.id}"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES


class Actor(models.TextChoices):
    CLIENT = "client"
    OPERATOR = "operator"
    WORKER = "worker"
    SYSTEM = "system"


class EventKind(models.TextChoices):
    """Every kind of entry a task's timeline can hold: the one vocabulary of ``TaskEvent``."""

    # acceptance
    ACCEPTED = "accepted"
    DUPLICATE_SUBMISSION = "duplicate_submission"
    # status changes (tasks_app.transitions)
    INPUT_REQUIRED = "input_required"
    RESUMED = "resumed"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCEL_REQUESTED = "cancel_requested"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    # legs and leases (tasks_app.runtime)
    LEG_STARTED = "leg_started"
    LEG_SUSPENDED = "leg_suspended"
    LEASE_EXPIRED = "lease_expired"
    UNDO_FINISHED = "undo_finished"
    # the effects ledger (tasks_app.runtime.effects)
    EFFECT_INTENDED = "effect_intended"
    EFFECT_CONFIRMED = "effect_confirmed"
    EFFECT_FAILED = "effect_failed"
    EFFECT_UNKNOWN = "effect_unknown"
    EFFECT_VERIFIED = "effect_verified"
    EFFECT_RETRIED = "effect_retried"
    EFFECT_NEEDS_RECONCILIATION = "effect_needs_reconciliation"
    EFFECT_RECONCILED = "effect_reconciled"
    EFFECT_COMPENSATED = "effect_compensated"
    EFFECT_COMPENSATION_FAILED = "effect_compensation_failed"
    # questions (elicitations.transitions)
    INPUT_REQUESTED = "input_requested"
    INPUT_ANSWERED = "input_answered"
    INPUT_ANSWER_REJECTED = "input_answer_rejected"
    INPUT_ANSWER_IGNORED = "input_answer_ignored"
    INPUT_ANSWER_REFUSED = "input_answer_refused"
    INPUT_EXPIRED = "input_expired"
    INPUT_CLOSED = "input_closed"
    # run again (tasks_app.rerun): on the original, and on the task that runs it again
    RAN_AGAIN = "ran_again"
    RUN_AGAIN_FROM = "run_again_from"
    # webhooks (tasks_app.webhooks)
    WEBHOOK_UNDELIVERED = "webhook_undelivered"
    # messages to the people who answer (elicitations.notices)
    NOTICE_UNDELIVERED = "notice_undelivered"


class TaskEvent(models.Model):
    """Append-only timeline of a task: what happened, who did it, when.

    Every task writes three of these on its way (accepted, leg started, completed), each in
    the statement that changes the task itself, so the foreign key is not checked by the
    database (``db_constraint=False``): the check locked the task row once per event (a
    WAL record each). Deleting a task deletes its events (``on_delete``, done by Django).
    """

    task = models.ForeignKey(
        Task, on_delete=models.CASCADE, related_name="events", db_constraint=False, db_index=False
    )
    kind = models.CharField(max_length=50, choices=EventKind.choices)
    actor_type = models.CharField(max_length=20, choices=Actor.choices)
    actor = models.CharField(max_length=200, blank=True)
    old_status = models.CharField(max_length=20, blank=True)
    new_status = models.CharField(max_length=20, blank=True)
    detail = models.JSONField(default=dict, blank=True)
    # Not indexed: a timeline is read through the task's foreign key.
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [models.Index(fields=["task"], name="event_task")]

    def __str__(self) -> str:
        return f"{self.kind} on {self.task_id}"


def event(
    task: Task,
    kind: EventKind,
    *,
    actor_type: str,
    actor: str = "",
    old_status: str = "",
    new_status: str = "",
    **detail: Any,
) -> TaskEvent:
    """Append one event to TASK's timeline (inside the caller's transaction)."""
    return TaskEvent.objects.create(
        task=task,
        kind=kind,
        actor_type=actor_type,
        actor=actor,
        old_status=old_status,
        new_status=new_status,
        detail=detail,
    )
