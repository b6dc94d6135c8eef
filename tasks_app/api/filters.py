"""The query of the task list and of the audit log: the pages' own filters, read and checked
by the code the pages use (``listing.TaskFilters``, ``audit.AuditFilters``); a filter that is
wrong is 400 with the pages' messages, under ``filters``. As DRF filter backends, they also
describe their parameters in the OpenAPI schema."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rest_framework import filters
from rest_framework.exceptions import ValidationError

from tasks_app.audit import AuditFilters
from tasks_app.listing import SORTS, Outcome, TaskFilters
from tasks_app.models import AuditAction, AuditOutcome, Status

# The task list's query keys (as on /tasks/), and ``tenant``: one tenant's tasks (its slug),
# as ``manage.py tasks --tenant``.
TASK_KEYS = ("status", "outcome", "tool", "client", "attention", "q", "sort", "from", "to")
TENANT = "tenant"
DATE = "A date (YYYY-MM-DD) or an ISO date-time"


def _parameter(name: str, description: str, **schema: Any) -> dict[str, Any]:
    return {
        "name": name,
        "required": False,
        "in": "query",
        "description": description,
        "schema": {"type": "string", **schema},
    }


def task_filters_of(query: Mapping[str, str]) -> tuple[TaskFilters, str]:
    """The list's filters and tenant slug in QUERY, as /tasks/ checks them; ValidationError
    (400) with its messages when one is wrong."""
    found = TaskFilters.from_query(query)
    if found.errors:
        raise ValidationError({"filters": list(found.errors)})
    return found, str(query.get(TENANT, "")).strip()[:100]


class TaskListFilter(filters.BaseFilterBackend):
    """The filters of /tasks/ (``TaskFilters``), and ``tenant``."""

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        return [
            _parameter("status", "Only tasks in this status.", enum=Status.values),
            _parameter("outcome", "What became of the task.", enum=Outcome.values),
            _parameter("tool", "Only this tool's tasks (its exact name)."),
            _parameter("client", "Only this client's tasks (its exact name)."),
            _parameter("attention", "1: only the tasks that need attention.", enum=["1"]),
            _parameter("q", "Search ids, idempotency keys, tools, clients and messages."),
            _parameter("sort", "The order (default: newest first).", enum=list(SORTS)),
            _parameter("from", f"{DATE}: created at or after it."),
            _parameter("to", f"{DATE}: created up to it (a date: the whole day)."),
            _parameter(TENANT, "Only this tenant's tasks (its slug)."),
        ]


def audit_filters_of(query: Mapping[str, str]) -> AuditFilters:
    """The audit log's filters in QUERY, as /audit/ checks them; ValidationError when wrong."""
    found = AuditFilters.from_query(query)
    if found.errors:
        raise ValidationError({"filters": list(found.errors)})
    return found


class AuditLogFilter(filters.BaseFilterBackend):
    """The filters of /audit/ (``AuditFilters``)."""

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        return [
            _parameter("actor", "Only this actor's entries (a username, exactly)."),
            _parameter("action", "Only this action.", enum=AuditAction.values),
            _parameter("outcome", "Only this outcome.", enum=AuditOutcome.values),
            _parameter("tenant", "Only this tenant's entries (its slug)."),
            _parameter("q", "Entries whose target contains this."),
            _parameter("from", f"{DATE}: at or after it."),
            _parameter("to", f"{DATE}: up to it (a date: the whole day)."),
        ]
