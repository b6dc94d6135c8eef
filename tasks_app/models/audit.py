"""The audit log: one row per operator action, written in the transaction of the action."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from tasks_app.models.clients import Tenant


class AuditAction(models.TextChoices):
    """Every action the audit log records: the one vocabulary of ``AuditEntry.action``."""

    TASK_CANCEL = "task.cancel", "Cancel a task"
    EFFECT_SETTLE = "effect.settle", "Settle an effect"
    BULK_CANCEL = "bulk.cancel", "Cancel all matching"
    BULK_SETTLE = "bulk.settle", "Settle all matching"
    BULK_RERUN = "bulk.rerun", "Run all matching again"
    TASK_RERUN = "task.rerun", "Run a task again"
    QUESTION_ANSWER = "question.answer", "Answer a question"
    WEBHOOK_RESEND = "webhook.resend", "Send a webhook again"
    WEBHOOK_ADD = "webhook.add", "Add a webhook endpoint"
    WEBHOOK_CHANGE = "webhook.change", "Change a webhook endpoint"
    WEBHOOK_REMOVE = "webhook.remove", "Remove a webhook endpoint"
    TOKEN_CREATE = "token.create", "Create a client token"
    TOKEN_REVOKE = "token.revoke", "Revoke a client token"
    OPERATOR_TOKEN_CREATE = "operator_token.create", "Create an operator token"
    OPERATOR_TOKEN_REVOKE = "operator_token.revoke", "Revoke an operator token"
    APP_CONNECT = "app.connect", "Connect an app"
    APP_REVOKE = "app.revoke", "Revoke a connected app"
    ROLE_CHANGE = "role.change", "Change a role"
    VIEW_SAVE = "view.save", "Save a view"
    VIEW_DELETE = "view.delete", "Delete a view"
    SIGN_IN = "auth.sign_in", "Sign in"
    SIGN_IN_FAILED = "auth.sign_in_failed", "Failed sign-in"
    SIGN_OUT = "auth.sign_out", "Sign out"
    LOCKOUT = "auth.lockout", "Locked out"


class AuditOutcome(models.TextChoices):
    DONE = "done"
    REFUSED = "refused"  # nothing changed: the target did not allow it (already ended, settled)
    FAILED = "failed"  # a sign-in that did not succeed


class AuditEntry(models.Model):
    """Who did what, when, from where, on what, and how it ended.

    ``actor`` is the username as it was (the user may be renamed or deleted later);
    ``address`` is the client address of the request (``operators.login_address``), empty
    for the shell. ``tenant`` is the tenant of the target, NULL for actions outside any
    tenant (sign-ins, role changes of a superuser). ``target`` names what was acted on as
    ``kind:id`` (``task:…``, ``effect:…``, ``client:…``, ``user:…``)."""

    at = models.DateTimeField(default=timezone.now)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_constraint=False,
    )
    actor = models.CharField(max_length=200)
    address = models.CharField(max_length=64, blank=True)
    action = models.CharField(max_length=40, choices=AuditAction.choices)
    tenant = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    target = models.CharField(max_length=250, blank=True)
    outcome = models.CharField(max_length=20, choices=AuditOutcome.choices)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        indexes = [
            # The audit page: newest first, read by keyset on (at, id); by actor; by action.
            models.Index(fields=["-at", "-id"], name="audit_recent"),
            models.Index(fields=["actor", "-at", "-id"], name="audit_actor_recent"),
            models.Index(fields=["action", "-at", "-id"], name="audit_action_recent"),
        ]
        verbose_name_plural = "audit entries"

    def __str__(self) -> str:
        return f"{self.actor} {self.action} {self.target} ({self.outcome})"
