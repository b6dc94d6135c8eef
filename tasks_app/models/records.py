"""Rows kept beside the tasks: the purge's archive, and the 2025 era's sessions and replies."""

from __future__ import annotations

import secrets

from django.db import models

from tasks_app.models.clients import Client
from tasks_app.models.tasks import Status


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
