"""Saved views of the task list: save the list as it is filtered (POST /views/), and delete
one's own (POST /views/<id>/delete/). The list names the views on the task list page."""

from __future__ import annotations

from urllib.parse import parse_qsl

from django.contrib import messages
from django.db import transaction
from django.http import Http404, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from tasks_app import audit, saved_views
from tasks_app.listing import TaskFilters
from tasks_app.models import AuditAction
from tasks_app.operators import HtmxHttpRequest, operator_login_required


@require_POST
@operator_login_required
def view_save(request: HtmxHttpRequest) -> HttpResponse:
    """Save the list the form's ``query`` (its query string) makes, as ``name``, shared with
    the tenant ``share`` names ("" for the operator alone), the default with ``default``."""
    query = request.POST.get("query", "")[:2000]
    filters = TaskFilters.from_query(dict(parse_qsl(query)))
    try:
        with transaction.atomic():
            view = saved_views.save(
                user=request.user,
                name=request.POST.get("name", ""),
                filters=filters,
                tenant=request.POST.get("share", ""),
                default=request.POST.get("default") == "1",
            )
            audit.record(audit.Who.of(request), AuditAction.VIEW_SAVE, tenant=view.tenant_id,
                         target=f"view:{view.pk}", name=view.name, query=view.query,
                         default=view.is_default)  # fmt: skip
    except saved_views.Refused as exc:
        messages.error(request, str(exc))
        return redirect(_list(saved_views.query_of(filters)))
    shared = f", shared with {view.tenant.slug}" if view.tenant else ""
    messages.success(request, f"Saved the view “{view.name}”{shared}.")
    return redirect(_list(view.query))


def _list(query: str) -> str:
    path = reverse("task_list")
    return f"{path}?{query}" if query else path


@require_POST
@operator_login_required
def view_delete(request: HtmxHttpRequest, view_id: int) -> HttpResponse:
    with transaction.atomic():
        view = saved_views.delete(user=request.user, view_id=view_id)
        if view is None:
            raise Http404("No such view of yours.")
        audit.record(audit.Who.of(request), AuditAction.VIEW_DELETE, tenant=view.tenant_id,
                     target=f"view:{view_id}", name=view.name, query=view.query)  # fmt: skip
    messages.success(request, "Deleted the view.")
    return redirect("task_list")
