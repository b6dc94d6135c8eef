"""The task page: status, arguments, result, questions, effects, webhooks, journal and
timeline, refreshed by a poll while the task runs."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.http import HttpResponse, QueryDict
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET
from django_htmx.http import HttpResponseStopPolling

from elicitations.selectors import input_requests_of_task
from tasks_app import operators, selectors
from tasks_app.console.pages import task_or_404, url
from tasks_app.console.task_list import LIST_KEYS
from tasks_app.models import JournalEntry, Task
from tasks_app.operators import HtmxHttpRequest, change_token, operator_login_required
from tasks_app.templatetags.operator_ui import pretty_json

TIMELINE_PAGE = 200
JOURNAL_CUT = 300


@require_GET
@operator_login_required
def task_detail(request: HtmxHttpRequest, task_id: str) -> HttpResponse:
    """One task: status, arguments, result, questions, effects, journal, timeline, actions."""
    task = task_or_404(request, task_id)
    before = _int(request.GET.get("events_before"))
    version = task_version(task)
    if request.htmx and request.GET.get("since") == version:
        if task.is_terminal:
            return HttpResponseStopPolling()
        return HttpResponse(status=204)
    return task_page(request, task, version=version, events_before=before)


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text else None
    except ValueError:
        return None


def task_version(task: Task) -> str:
    """The task page's change token: the status, the row's last change, the latest event and
    the latest webhook attempt."""
    last_event, last_try = selectors.task_latest_ids(task)
    parts: list[object] = [task.status, task.updated_at.timestamp(), last_event]
    if last_try is not None:
        parts.append(last_try)
    return change_token(*parts)


def task_page(
    request: HtmxHttpRequest,
    task: Task,
    *,
    version: str | None = None,
    events_before: int | None = None,
    status: int = 200,
    reconcile_errors: dict[int, str] | None = None,
    reconcile_notes: dict[int, str] | None = None,
    notice: str = "",
) -> HttpResponse:
    """The page of TASK (its body alone for htmx), with the actions' errors, notes or NOTICE."""
    user = request.user
    events, earlier = selectors.timeline_of(task, before=events_before, page=TIMELINE_PAGE)
    back = _list_query(request.GET.get("from", ""))
    poll = {"since": version or task_version(task)}
    if events_before:
        poll["events_before"] = str(events_before)
    if back:
        poll["from"] = back
    context = {
        "task": task,
        "origin": selectors.origins_of([task.pk]).get(task.pk),
        "input_requests": input_requests_of_task(task_id=task.pk),
        "effects": selectors.effects_of(task),
        "webhook_messages": selectors.webhook_messages_of(task),
        "journal": [_journal_row(e) for e in selectors.journal_of(task)],
        "events": events,
        "earlier_events_url": url("task_detail", {"events_before": str(earlier)}, task.pk)
        if earlier
        else "",
        "latest_events_url": reverse("task_detail", args=[task.pk]) if events_before else "",
        "poll_url": url("task_detail", poll, task.pk),
        "back_url": url("task_list", QueryDict(back).dict()) if back else reverse("task_list"),
        "from_list": back,
        "cancel_event": selectors.cancel_request_of(task),
        "can_cancel": operators.may(user, operators.CANCEL_TASKS, task.client.tenant_id)
        and not task.is_terminal
        and task.cancel_requested_at is None,
        "can_reconcile": operators.may(user, operators.RECONCILE_EFFECTS, task.client.tenant_id),
        "can_rerun": task.is_terminal
        and operators.may(user, operators.RERUN_TASKS, task.client.tenant_id),
        "rerun_of": selectors.visible_or_none(user, task.rerun_of_id),
        "reruns": selectors.reruns_of(user, task),
        "reconcile_errors": reconcile_errors or {},
        "reconcile_notes": reconcile_notes or {},
        "notice": notice,
        "nav": "tasks",
    }
    template = "tasks_app/task_detail.html"
    if request.htmx:
        template += "#task_body"
    return render(request, template, context, status=status)


def _list_query(text: str) -> str:
    """The list's query string a task page was opened from, keeping only the list's keys."""
    given = QueryDict(text[:2000])
    return urlencode({k: given[k] for k in LIST_KEYS if given.get(k)})


def _journal_row(entry: JournalEntry) -> dict[str, Any]:
    text = pretty_json(entry.outcome)
    cut = len(text) > JOURNAL_CUT
    return {
        "seq": entry.seq,
        "kind": entry.kind,
        "name": entry.name,
        "at": entry.created_at,
        "outcome": text[: JOURNAL_CUT - 1] + "…" if cut else text,
        "cut": cut,
    }
