"""Tasks, their clients and everything recorded about them.

The database is the source of truth for every task, event, journal entry and effect; Celery
only delivers "run this task id now". Status changes go through ``tasks_app.transitions``.
"""

from __future__ import annotations

import secrets
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q


def new_task_id() -> str:
    # 24 bytes from the OS CSPRNG = 192 bits, URL-safe base64 (32 characters).
    return secrets.token_urlsafe(24)


class Tenant(models.Model):
    """A group of MCP clients and of the operators who may see their tasks."""

    slug = models.SlugField(max_length=100, unique=True)
    members = models.ManyToManyField(
        settings.AUTH_USER_MODEL, blank=True, related_name="tenants", through="Membership"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    """A user in a tenant, with their role there (``tasks_app.operators.ROLES``): a user can be
    an operator in one tenant and a viewer in another. No role: a member who sees nothing."""

    class Role(models.TextChoices):
        NONE = "", "no role"
        VIEWER = "viewer"
        ANSWERER = "answerer"
        OPERATOR = "operator"

    # The table of the many-to-many field this model took over (roles came later).
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=20, choices=Role.choices, default="", blank=True)

    class Meta:
        db_table = "tasks_app_tenant_members"
        unique_together = [("tenant", "user")]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant}" + (f" ({self.role})" if self.role else "")


class Client(models.Model):
    """An MCP caller (principal). Tasks and idempotency keys are scoped to it."""

    name = models.CharField(max_length=100, unique=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="clients")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name


class ClientToken(models.Model):
    """A bearer token of a client. Only a keyed hash is stored; the token is shown once."""

    client = models.ForeignKey(Client, on_delete=models.CASCADE, related_name="tokens")
    token_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12, help_text="First characters, to tell tokens apart")
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.client})"


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
    INTERNAL = "internal"


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
            # claiming, tasks_app.sql).
            models.Index(
                fields=["lease_expires_at"],
                condition=Q(lease_expires_at__isnull=False),
                name="task_leased",
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


class JournalKind(models.TextChoices):
    ASK = "ask"
    EFFECT = "effect"
    STEP = "step"


class JournalEntry(models.Model):
    """One journaled ctx call of a task's tool function, by call order."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="journal")
    seq = models.IntegerField()
    kind = models.CharField(max_length=10, choices=JournalKind.choices)
    name = models.CharField(max_length=200)
    outcome = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["task", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["task", "seq"], name="journal_unique_task_seq")
        ]

    def __str__(self) -> str:
        return f"{self.task_id}#{self.seq} {self.kind} {self.name}"


class EffectState(models.TextChoices):
    INTENDED = "intended"
    CONFIRMED = "confirmed"
    FAILED = "failed"
    UNKNOWN = "unknown"
    COMPENSATED = "compensated"


class Effect(models.Model):
    """One external side effect of a task, and whether it actually happened."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="effects")
    seq = models.IntegerField()
    name = models.CharField(max_length=200)
    target = models.CharField(max_length=500, blank=True)
    downstream_key = models.CharField(max_length=300, unique=True)
    state = models.CharField(max_length=20, choices=EffectState.choices)
    # The tool gave a compensate hook: a cancelled task undoes this effect if it happened.
    compensable = models.BooleanField(default=False)
    detail = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    settled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["task", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["task", "seq"], name="effect_unique_task_seq"),
            models.CheckConstraint(
                condition=Q(state__in=EffectState.values), name="effect_state_valid"
            ),
        ]
        indexes = [
            # The dashboard's attention list: tasks with an effect waiting for an operator.
            models.Index(fields=["task"], condition=Q(state="unknown"), name="effect_unknown"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.state})"


class Dispatch(models.Model):
    """Outbox: a task id that needs a "run now" message published to the broker.

    Written in the caller's transaction; published after commit; a periodic sweeper
    publishes whatever is still unpublished (broker outage, process killed in between).

    Written with its task (in the statement that inserts it, or in the transaction that
    changes it), so neither foreign key is checked by the database (``db_constraint=False``):
    on every new task the checks locked the task's and the tenant's rows, one tenant row
    shared by every concurrent call. Deleting a task deletes its records (Django).
    """

    task = models.ForeignKey(
        Task,
        on_delete=models.CASCADE,
        related_name="dispatches",
        db_constraint=False,
        db_index=False,
    )
    # The task's tenant, copied here so that a worker can take the oldest waiting record of
    # each tenant through one index (``sql`` claim_next: fair claiming across tenants).
    tenant = models.ForeignKey(
        Tenant,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        db_index=False,
        db_constraint=False,
        related_name="+",
    )
    reason = models.CharField(max_length=50)
    created_at = models.DateTimeField(auto_now_add=True)
    published_at = models.DateTimeField(null=True, blank=True)
    attempts = models.IntegerField(default=0)
    # Set by the leg that received this record's message: a second delivery of the same
    # message (broker redelivery, a record published twice) finds it set and does nothing.
    consumed_at = models.DateTimeField(null=True, blank=True)
    # Where the record came from (``logcontext.origin``: the request id and client of the
    # call that wrote it), for the log lines of the leg it starts.
    context = models.JSONField(default=dict, blank=True)

    class Meta:
        indexes = [
            # A task's records (its timeline, the purge).
            models.Index(fields=["task"], name="dispatch_task"),
            # The sweeper's query: unpublished records no leg took, oldest first.
            models.Index(
                fields=["created_at"],
                condition=Q(published_at__isnull=True, consumed_at__isnull=True),
                name="dispatch_unpublished",
            ),
            # Records no leg consumed yet, by tenant, oldest first: the oldest waiting record
            # of each tenant, and of none (``tasks_app.sql``'s fair claim), and whether any
            # waits. Not also an index by id alone: a look for the untenanted head that the
            # planner sent through it (no statistics yet: a new database, or autovacuum off)
            # walked every waiting record and read its row to check the tenant.
            models.Index(
                fields=["tenant", "id"],
                condition=Q(consumed_at__isnull=True),
                name="dispatch_waiting_tenant",
            ),
            # The sweeper's other query: published records no leg consumed (the broker may
            # have lost their message). Consumed records leave this index.
            models.Index(
                fields=["published_at"],
                condition=Q(consumed_at__isnull=True, published_at__isnull=False),
                name="dispatch_unconsumed",
            ),
        ]

    def __str__(self) -> str:
        return f"dispatch {self.task_id} ({self.reason})"


class Drainer(models.Model):
    """A worker process running waiting legs straight from the dispatch records
    (``runtime.run_waiting_legs``), and until when it will look for the next one.

    While a fresh row exists, a new task's record needs no broker message: that process
    takes it from the table (``tasks_app.dispatch``). A process leaves by deleting its row and
    then looking once more, so a record committed before another process read the row is
    always seen; a killed process's row goes stale within ``TASKDESK_DRAIN_WINDOW_SECONDS``,
    and the sweeper publishes what it left.

    A drainer that finds nothing waiting stands by (PostgreSQL): ``standby`` is set, and it
    waits on ``LISTEN channel`` for the rest of its time. A web process hands a new record to
    one standing-by drainer (clearing ``standby`` and notifying its channel in one statement)
    instead of publishing a message.
    """

    name = models.CharField(max_length=200, primary_key=True)
    until = models.DateTimeField()
    standby = models.BooleanField(default=False)
    channel = models.CharField(max_length=63, blank=True)

    def __str__(self) -> str:
        return f"{self.name} until {self.until}"


class DemoRefund(models.Model):
    """The demo toolset's stand-in for a payment provider's refunds (``refund_payment``).

    The unique downstream key is what makes a second refund of one task impossible, however
    the rest of the system failed: the provider refuses a key it has already seen, and counts
    the calls it refused (``refused_calls``), so the calls it got are ``1 + refused_calls``.
    """

    downstream_key = models.CharField(max_length=300, unique=True)
    payment_id = models.CharField(max_length=200)
    amount_cents = models.BigIntegerField()
    reason = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    refused_calls = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return f"refund {self.pk} of {self.payment_id}"


class PurgedTask(models.Model):
    """What is left of a task after the purge (``tasks_app.retention``): one archive line per
    purged task, so an operator can still answer "did key K of client C ever run, and how did
    it end?". Exported with ``manage.py export_purged_tasks``. No foreign keys: the client
    may be deleted later; its name is kept."""

    task_id = models.CharField(max_length=64, unique=True)
    # NULL for keyless tasks, as on Task.
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    client_id = models.IntegerField()
    client_name = models.CharField(max_length=100)
    tool_name = models.CharField(max_length=200)
    # The terminal status, and for a completed task whether its result was a tool error.
    status = models.CharField(max_length=20, choices=Status.choices)
    is_error = models.BooleanField(default=False)
    created_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    purged_at = models.DateTimeField(db_index=True)

    class Meta:
        indexes = [
            models.Index(fields=["client_id", "idempotency_key"], name="purged_client_key"),
        ]

    def __str__(self) -> str:
        return f"purged {self.task_id} ({self.status})"

    @property
    def outcome(self) -> str:
        """``completed``, ``completed_with_error``, ``failed`` or ``cancelled``."""
        if self.status == Status.COMPLETED and self.is_error:
            return "completed_with_error"
        return str(self.status)


class WorkerHeartbeat(models.Model):
    """Last sign of life of a Celery worker or of beat (``tasks_app.tasks``): each worker
    writes its own row, named after its node (``NAME@HOST``), with the queues it consumes;
    ``heartbeat_job``, which beat schedules and a control worker runs, writes a row named
    after the host that ran it, with ``BEAT`` in place of the queues."""

    hostname = models.CharField(max_length=200, unique=True)
    seen_at = models.DateTimeField()
    # The queues the worker consumes, comma-separated; BEAT for heartbeat_job's row.
    queues = models.CharField(max_length=200, default="control")

    # The three heartbeats /readyz and /metrics report.
    LEGS = "legs"
    CONTROL = "control"
    BEAT = "beat"
    ROLES = (LEGS, CONTROL, BEAT)

    def __str__(self) -> str:
        return f"{self.hostname} @ {self.seen_at}"

    @classmethod
    def newest_by_role(cls) -> dict[str, datetime | None]:
        """The newest heartbeat of each role (None while no row of it exists), as /readyz
        and /metrics report them: ``legs``, of a worker that consumes any queue besides the
        control queue, so that legs can run; ``control``, of a worker that consumes the
        control queue alone, so that a control worker runs; ``beat``, of ``heartbeat_job``'s
        row, so that beat schedules the periodic jobs (and a control worker runs them). The
        control worker's own row stays fresh without beat, hence the third role."""
        control = settings.TASKDESK_CONTROL_QUEUE
        newest: dict[str, datetime | None] = dict.fromkeys(cls.ROLES)
        by_queues = (
            cls.objects.order_by()
            .values_list("queues")
            .annotate(last=models.Max("seen_at"))
            .values_list("queues", "last")
        )
        for queues, last in by_queues:
            if queues == cls.BEAT:
                role = cls.BEAT
            elif set(queues.split(",")) - {control}:
                role = cls.LEGS
            else:
                role = cls.CONTROL
            current = newest[role]
            if current is None or last > current:
                newest[role] = last
        return newest


def new_session_id() -> str:
    # Visible ASCII only (0x21-0x7E), as the 2025 transport requires of Mcp-Session-Id.
    return secrets.token_urlsafe(24)


class McpSession(models.Model):
    """A session of the 2025-11-25 handshake wire (``initialize`` .. ``DELETE``).

    Kept in the database so that any web process serves any session and a restart loses
    none. A session belongs to its client; the client's tasks do not belong to the session.
    """

    id = models.CharField(primary_key=True, max_length=64, default=new_session_id, editable=False)
    client = models.ForeignKey(Client, on_delete=models.CASCADE, related_name="mcp_sessions")
    protocol_version = models.CharField(max_length=16)
    capabilities = models.JSONField(default=dict, blank=True)
    client_info = models.JSONField(default=dict, blank=True)
    log_level = models.CharField(max_length=16, blank=True)
    created_at = models.DateTimeField()
    last_seen_at = models.DateTimeField(db_index=True)

    def __str__(self) -> str:
        return f"session {self.id[:8]}… of {self.client_id}"


class McpReply(models.Model):
    """A client's JSON-RPC response to a request the server sent on a session's stream,
    waiting for the web process that asked (which may be another process). Created without
    a body when the request is sent (the server awaits it); only such a row takes a body."""

    session = models.ForeignKey(McpSession, on_delete=models.CASCADE, related_name="replies")
    request_id = models.CharField(max_length=200)
    body = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["session", "request_id"], name="reply_once")]

    def __str__(self) -> str:
        return f"reply {self.request_id}"


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


# --- webhooks and the outbox of messages ------------------------------------------------------


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
