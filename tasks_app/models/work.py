"""What a task's legs record: the journal, the effects ledger, the dispatch records, the
drainers and the workers' heartbeats."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import models
from django.db.models import Q

from tasks_app.models.clients import Tenant
from tasks_app.models.tasks import Task


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
            # /metrics counts the effects in flight exactly, however large the ledger.
            models.Index(fields=["task"], condition=Q(state="intended"), name="effect_intended"),
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
            # of each tenant, and of none (``tasks_app.db``'s fair claim), and whether any
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


class WorkerHeartbeat(models.Model):
    """Last sign of life of a Celery worker or of beat (``tasks_app.tasks``): each worker
    writes its own row, named after its node (``NAME@HOST``), with the queues it consumes;
    ``heartbeat_job``, which beat schedules and a control worker runs, writes a row named
    after the host that ran it, with ``BEAT`` in place of the queues."""

    hostname = models.CharField(max_length=200, unique=True)
    seen_at = models.DateTimeField()
    # The queues the worker consumes, comma-separated; BEAT for heartbeat_job's row.
    queues = models.CharField(max_length=200, default="control")
    # What /workers/ shows of the node: its host (as lease owners name it), its pool (kind,
    # concurrency, process ids, the ones replaced lately), its main process id and when it
    # started (``tasks.PoolDetail``). Empty for heartbeat_job's row.
    detail = models.JSONField(default=dict, blank=True)

    # The three heartbeats /healthz and /metrics report.
    LEGS = "legs"
    CONTROL = "control"
    BEAT = "beat"
    ROLES = (LEGS, CONTROL, BEAT)

    def __str__(self) -> str:
        return f"{self.hostname} @ {self.seen_at}"

    @classmethod
    def role_of(cls, queues: str) -> str:
        """The role of a row whose queues are QUEUES: ``beat`` (heartbeat_job's row), ``legs``
        (a worker that consumes any queue besides the control queue) or ``control``."""
        if queues == cls.BEAT:
            return cls.BEAT
        if set(queues.split(",")) - {settings.TASKDESK_CONTROL_QUEUE}:
            return cls.LEGS
        return cls.CONTROL

    @classmethod
    def newest_by_role(cls) -> dict[str, datetime | None]:
        """The newest heartbeat of each role (None while no row of it exists), as /healthz
        and /metrics report them: ``legs``, of a worker that consumes any queue besides the
        control queue, so that legs can run; ``control``, of a worker that consumes the
        control queue alone, so that a control worker runs; ``beat``, of ``heartbeat_job``'s
        row, so that beat schedules the periodic jobs (and a control worker runs them). The
        control worker's own row stays fresh without beat, hence the third role."""
        newest: dict[str, datetime | None] = dict.fromkeys(cls.ROLES)
        by_queues = (
            cls.objects.order_by()
            .values_list("queues")
            .annotate(last=models.Max("seen_at"))
            .values_list("queues", "last")
        )
        for queues, last in by_queues:
            role = cls.role_of(queues)
            current = newest[role]
            if current is None or last > current:
                newest[role] = last
        return newest
