"""Tasks, their clients and everything recorded about them.

The database is the source of truth for every task, event, journal entry and effect; Celery
only delivers "run this task id now". Status changes go through ``tasks_app.transitions``.
One module a subject: ``clients`` (tenants, clients, tokens), ``tasks`` (the task, its
statuses and its timeline), ``work`` (journal, effects, dispatch records, workers), ``records``
(the purge's archive, 2025 sessions and replies), ``outbox`` (webhook
endpoints, messages and their attempts) ``audit`` (the operators' actions), ``bulk`` (actions on
every task of a filtered list), ``views`` (saved task lists), ``operator_tokens`` (the
operators' bearer tokens for /api/) and ``oauth`` (the built-in authorization server's apps,
grants, codes and tokens, and which app started a task).
"""

from __future__ import annotations

from tasks_app.models.audit import AuditAction, AuditEntry, AuditOutcome
from tasks_app.models.bulk import (
    BulkAction,
    BulkActionTask,
    BulkItemOutcome,
    BulkKind,
    BulkState,
)
from tasks_app.models.clients import (
    Client,
    ClientToken,
    Membership,
    Tenant,
)
from tasks_app.models.oauth import OAuthApp, OAuthCode, OAuthGrant, OAuthToken, TaskOrigin
from tasks_app.models.operator_tokens import OperatorToken
from tasks_app.models.outbox import (
    Channel,
    DeliveryAttempt,
    OutboxMessage,
    WebhookEndpoint,
    WebhookEvent,
    new_message_id,
)
from tasks_app.models.records import (
    McpReply,
    McpSession,
    PurgedTask,
    new_session_id,
)
from tasks_app.models.tasks import (
    ACTIVE_STATUSES,
    NO_TASKS,
    TASKS_EXTENSION,
    TERMINAL_STATUSES,
    Actor,
    Era,
    EventKind,
    Status,
    Task,
    TaskEvent,
    event,
    new_task_id,
)
from tasks_app.models.views import SavedView
from tasks_app.models.work import (
    Dispatch,
    Drainer,
    Effect,
    EffectState,
    JournalEntry,
    JournalKind,
    WorkerHeartbeat,
)

__all__ = [
    "ACTIVE_STATUSES",
    "NO_TASKS",
    "TASKS_EXTENSION",
    "TERMINAL_STATUSES",
    "Actor",
    "AuditAction",
    "AuditEntry",
    "AuditOutcome",
    "BulkAction",
    "BulkActionTask",
    "BulkItemOutcome",
    "BulkKind",
    "BulkState",
    "Channel",
    "Client",
    "ClientToken",
    "DeliveryAttempt",
    "Dispatch",
    "Drainer",
    "Effect",
    "EffectState",
    "Era",
    "EventKind",
    "JournalEntry",
    "JournalKind",
    "McpReply",
    "McpSession",
    "Membership",
    "OAuthApp",
    "OAuthCode",
    "OAuthGrant",
    "OAuthToken",
    "OperatorToken",
    "OutboxMessage",
    "PurgedTask",
    "SavedView",
    "Status",
    "Task",
    "TaskEvent",
    "TaskOrigin",
    "Tenant",
    "WebhookEndpoint",
    "WebhookEvent",
    "WorkerHeartbeat",
    "event",
    "new_message_id",
    "new_session_id",
    "new_task_id",
]
