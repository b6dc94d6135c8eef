"""Reads used by the MCP handlers, views and jobs. Permission checks live here."""

from __future__ import annotations

import time

from django.contrib.auth.models import AnonymousUser, User
from django.db.models import QuerySet

from tasks_app import sql
from tasks_app.models import Client, Task


class TaskNotFound(Exception):
    pass


def task_get_for_client(*, client: Client, task_id: str) -> Task:
    """Return CLIENT's task TASK_ID. Another client's task is reported exactly like a missing one."""
    task = sql.hot_path().task_for_client(client.pk, task_id)
    if task is None:
        raise TaskNotFound(task_id)
    return task


def tasks_visible_to(user: User | AnonymousUser) -> QuerySet[Task]:
    """Tasks an operator may see: their tenants' tasks (superusers see all)."""
    qs = Task.objects.select_related("client__tenant")
    if user.is_superuser:
        return qs
    if not isinstance(user, User):  # anonymous: no tenant
        return qs.none()
    return qs.filter(client__tenant__members=user)


def task_get_for_operator(*, user: User | AnonymousUser, task_id: str) -> Task:
    """Return task TASK_ID if USER may see it (its tenant's member, or a superuser).

    Raise TaskNotFound otherwise: another tenant's task looks exactly like a missing one.
    """
    if not user.is_authenticated or not user.is_active:
        raise TaskNotFound(task_id)
    try:
        return tasks_visible_to(user).get(pk=task_id)
    except (Task.DoesNotExist, ValueError):
        raise TaskNotFound(task_id) from None


def wait_for_outcome(task_id: str, timeout: float) -> Task:
    """Return task TASK_ID once it is terminal, or as it is when TIMEOUT seconds ran out.

    Polls the database (each read sees the latest commit), quickly at first and then every
    quarter second. Raise TaskNotFound if the task no longer exists. Call it outside any
    transaction.
    """
    deadline = time.monotonic() + timeout
    delay = 0.02
    while True:
        task = Task.objects.filter(pk=task_id).first()
        if task is None:
            raise TaskNotFound(task_id)
        left = deadline - time.monotonic()
        if task.is_terminal or left <= 0:
            return task
        time.sleep(min(delay, left))
        delay = min(delay * 1.5, 0.25)
