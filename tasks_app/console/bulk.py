"""Cancel all matching, Settle all matching: the dry run and its confirmation
(/tasks/bulk/<kind>/?<the list's filters>), and the action's progress and record (/bulk/<id>/).

The dry run shows how many tasks match and what would become of them; over
``bulk.CONFIRM_OVER`` tasks the operator types the count to confirm. The action then runs as a
control job (``tasks_app.bulk``); its page refreshes itself until it has finished, and keeps
the list of every task it touched.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.utils.dateparse import parse_datetime
from django.views.decorators.http import require_GET, require_http_methods

from tasks_app import audit, bulk, runtime
from tasks_app.console.pages import url
from tasks_app.listing import TaskFilters
from tasks_app.models import BulkAction, BulkActionTask, BulkKind
from tasks_app.operators import HtmxHttpRequest, change_token, operator_login_required

ITEMS_SHOWN = 500  # the tasks a bulk action's page lists (the count says how many in all)


@require_http_methods(["GET", "POST"])
@operator_login_required
def bulk_confirm(request: HtmxHttpRequest, kind: str) -> HttpResponse:
    """GET: the dry run of KIND on the list the query string makes. POST: start it."""
    kind = BulkKind(kind)
    if not bulk.may(request.user, kind):
        raise PermissionDenied(bulk.NOT_PERMITTED[kind])
    filters = TaskFilters.from_query(request.GET)
    context: dict[str, Any] = {
        "kind": kind,
        "label": kind.label,
        "filters": filters,
        "list_url": url("task_list", filters.query()),
        "nav": "tasks",
    }
    if filters.errors:
        return render(request, "tasks_app/bulk_confirm.html", context, status=400)
    try:
        preview = bulk.preview(user=request.user, kind=kind, filters=filters)
    except (bulk.TooMany, bulk.NotApplicable) as exc:
        context["refusal"] = str(exc)
        return render(request, "tasks_app/bulk_confirm.html", context, status=400)
    context["preview"] = preview
    context["confirm_over"] = bulk.CONFIRM_OVER
    if request.method == "GET":
        return render(request, "tasks_app/bulk_confirm.html", context)
    return _start(request, kind, filters, preview, context)


def _start(
    request: HtmxHttpRequest,
    kind: BulkKind,
    filters: TaskFilters,
    preview: bulk.Preview,
    context: dict[str, Any],
) -> HttpResponse:
    """Start KIND from the confirmed dry run: the moment and count it was shown (the form's
    ``until`` and ``expected``) and, over CONFIRM_OVER tasks, the count typed."""
    errors = []
    until = _moment(request.POST.get("until", ""))
    expected = request.POST.get("expected", "")
    if until is None or not expected.isdigit():
        errors.append("The confirmation is incomplete: open the dry run again.")
    elif int(expected) > bulk.CONFIRM_OVER and request.POST.get("typed", "").strip() != expected:
        errors.append(f"Type {expected} (the number of matching tasks) to confirm.")
    happened = {"yes": True, "no": False}.get(request.POST.get("happened", ""))
    note = request.POST.get("note", "").strip()[: runtime.RECONCILE_NOTE_MAX]
    if kind == BulkKind.SETTLE:
        if happened is None:
            errors.append("Choose It happened or It did not happen.")
        if not note:
            errors.append("A note is required: write what you checked and what you found.")
    reuse = request.POST.get("reuse", "default")
    if kind == BulkKind.RERUN and reuse not in bulk.REUSE:
        errors.append("Choose whether the new tasks reuse what happened.")
    if errors or until is None:
        context.update(errors=errors, note=note, happened=request.POST.get("happened", ""))
        return render(request, "tasks_app/bulk_confirm.html", context, status=400)
    action = bulk.start(audit.Who.of(request), kind=kind, filters=filters, until=until,
                        expected=int(expected), happened=happened, note=note,
                        reuse=bulk.REUSE.get(reuse))  # fmt: skip
    return redirect("bulk_detail", bulk_id=action.pk)


def _moment(text: str) -> datetime | None:
    try:
        moment = parse_datetime(text)
    except ValueError:
        return None
    return moment if moment is not None and moment.tzinfo is not None else None


@require_GET
@operator_login_required
def bulk_detail(request: HtmxHttpRequest, bulk_id: int) -> HttpResponse:
    """A bulk action's progress while it runs, then its record: every task it touched."""
    action = BulkAction.objects.filter(pk=bulk_id).first()
    if action is None or not bulk.may_see(request.user, action):
        raise Http404("No such bulk action.")
    version = change_token(action.state, action.handled, action.touched_at)
    if request.htmx and request.GET.get("since") == version:
        return HttpResponse(status=204)
    items = BulkActionTask.objects.filter(bulk=action).order_by("id")
    context = {
        "bulk": action,
        "items": list(items[:ITEMS_SHOWN]),
        "more": max(action.matched - ITEMS_SHOWN, 0),
        "version": version,
        "percent": _percent(action),
        "list_url": url("task_list", action.query),
        "nav": "tasks",
    }
    template = "tasks_app/bulk_detail.html"
    if request.htmx:
        template += "#progress"
    return render(request, template, context)


def _percent(action: BulkAction) -> int:
    if action.finished:
        return 100
    total = max(action.expected, action.matched, 1)
    return min(99, int(100 * action.handled / total))
