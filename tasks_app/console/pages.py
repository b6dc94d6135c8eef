"""What the console's views share: links, the task lookup, and the not-found page."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest
from django.urls import reverse

from tasks_app import selectors
from tasks_app.models import Task

NOT_PERMITTED = "Your role does not allow this."


def not_found() -> Http404:
    return Http404("No such task.")


def url(name: str, query: dict[str, str], *args: Any) -> str:
    """The path of the view NAME (with ARGS), with QUERY as its query string."""
    path = reverse(name, args=args)
    return f"{path}?{urlencode(query)}" if query else path


def task_or_404(request: HttpRequest, task_id: str, permission: str = "") -> Task:
    """The task the operator may see (and, with PERMISSION, act on); 404 or 403 otherwise."""
    try:
        return selectors.task_get_for_operator(
            user=request.user, task_id=task_id, permission=permission
        )
    except selectors.TaskNotFound:
        raise not_found() from None
    except selectors.NotPermitted:
        raise PermissionDenied(NOT_PERMITTED) from None
