"""Bulk actions: "Cancel all matching" and "Settle all matching" on a filtered task list,
run in batches by a control job, and the record of every task each one touched."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class BulkKind(models.TextChoices):
    CANCEL = "cancel", "Cancel all matching"
    SETTLE = "settle", "Settle all matching"
    RERUN = "rerun", "Run all matching again"


class BulkState(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class BulkItemOutcome(models.TextChoices):
    DONE = "done"
    SKIPPED = "skipped"  # nothing to do: the task had ended, its effects were settled
    REFUSED = "refused"  # the operator's role in the task's tenant does not allow it


class BulkAction(models.Model):
    """One "… all matching": who asked, the list it applies to (``query``: the task list's
    query string, as the operator confirmed it), and how far the job has got.

    Only tasks created up to ``until`` (the confirmation) match, so tasks that arrive while
    the job runs are never swept along. ``expected`` is the dry run's count the operator
    confirmed; ``matched``, ``done``, ``skipped`` and ``refused`` are what the job found,
    written after each batch together with ``cursor`` (where the next batch starts) and
    ``touched_at`` (a job that stops touching it is taken up again by the sweeper)."""

    kind = models.CharField(max_length=20, choices=BulkKind.choices)
    state = models.CharField(max_length=20, choices=BulkState.choices, default=BulkState.QUEUED)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_constraint=False,
    )
    actor = models.CharField(max_length=200)
    # Started by `manage.py tasks` (every tenant, or TENANT's alone), not by a signed-in user.
    from_shell = models.BooleanField(default=False)
    tenant = models.CharField(max_length=100, blank=True)
    query = models.JSONField(default=dict, blank=True)
    until = models.DateTimeField()
    expected = models.IntegerField(default=0)
    # Settle all matching: the decision and the note applied to every unknown effect.
    happened = models.BooleanField(null=True, blank=True)
    note = models.TextField(blank=True)
    # Run all matching again: whether each new task reuses what its original recorded (None:
    # each task's default, reuse when it failed or was cancelled).
    reuse = models.BooleanField(null=True, blank=True)
    matched = models.IntegerField(default=0)
    done = models.IntegerField(default=0)
    skipped = models.IntegerField(default=0)
    refused = models.IntegerField(default=0)
    cursor = models.TextField(blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    touched_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            # The sweeper's look for jobs that stopped (few rows are ever unfinished).
            models.Index(
                fields=["touched_at"],
                condition=models.Q(state__in=["queued", "running"]),
                name="bulk_unfinished",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} #{self.pk} by {self.actor} ({self.state})"

    @property
    def finished(self) -> bool:
        return self.state in (BulkState.DONE, BulkState.FAILED)

    @property
    def handled(self) -> int:
        return self.done + self.skipped + self.refused


class BulkActionTask(models.Model):
    """A task one bulk action touched, and what it did to it. The task id is kept as text:
    the record outlives the task's purge."""

    bulk = models.ForeignKey(BulkAction, on_delete=models.CASCADE, related_name="items")
    task_id = models.CharField(max_length=64)
    outcome = models.CharField(max_length=20, choices=BulkItemOutcome.choices)
    reason = models.CharField(max_length=300, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["bulk", "task_id"], name="bulk_task_once"),
        ]

    def __str__(self) -> str:
        return f"{self.task_id} {self.outcome}"
