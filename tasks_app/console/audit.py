"""/audit/: the operators' actions, newest first, filtered by who, what, where, how it ended
and when; and the same as CSV or JSON Lines (/audit/export.csv, /audit/export.jsonl).

Who may read which entries is ``tasks_app.audit.entries_for``: an operator reads their
tenants' entries and their own sign-ins; a role without the audit permission gets 403.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import render
from django.views.decorators.http import require_GET

from tasks_app import audit
from tasks_app.console.export import csv_lines, jsonl_lines, streamed
from tasks_app.console.pages import url
from tasks_app.models import AuditAction, AuditOutcome, Tenant
from tasks_app.operators import HtmxHttpRequest, operator_login_required

NOT_PERMITTED = "Your role does not include reading the audit log."
# Free text in an entry: its actor, target and detail (the others are fixed words and times).
TEXT_COLUMNS = frozenset({"actor", "target", "detail", "tenant"})


@require_GET
@operator_login_required
def audit_log(request: HtmxHttpRequest) -> HttpResponse:
    if not audit.may_read(request.user):
        raise PermissionDenied(NOT_PERMITTED)
    filters = audit.AuditFilters.from_query(request.GET)
    context: dict[str, Any] = {
        "filters": filters,
        "actions": AuditAction.choices,
        "outcomes": AuditOutcome.choices,
        "tenants": _tenants(request),
        "nav": "audit",
    }
    if filters.errors:
        return render(request, "tasks_app/audit.html", context, status=400)
    page = audit.page_for(request.user, filters, before=request.GET.get("before", ""))
    context.update(
        entries=page.entries,
        older_url=url("audit_log", {**filters.query(), "before": page.older}) if page.older else "",
        first_url=url("audit_log", filters.query()) if request.GET.get("before") else "",
        csv_url=url("audit_export", filters.query(), "csv"),
        jsonl_url=url("audit_export", filters.query(), "jsonl"),
    )
    return render(request, "tasks_app/audit.html", context)


@require_GET
@operator_login_required
def audit_export(request: HtmxHttpRequest, fmt: str) -> HttpResponseBase:
    if not audit.may_read(request.user):
        raise PermissionDenied(NOT_PERMITTED)
    filters = audit.AuditFilters.from_query(request.GET)
    if filters.errors:
        return HttpResponse(
            "\n".join(filters.errors) + "\n", status=400, content_type="text/plain; charset=utf-8"
        )
    records = (audit.export_record(e) for e in audit.entries_for_export(request.user, filters))
    if fmt == "csv":
        lines = csv_lines(records, audit.EXPORT_COLUMNS, TEXT_COLUMNS)
    else:
        lines = jsonl_lines(records)
    return streamed(lines, fmt, "audit")


def _tenants(request: HtmxHttpRequest) -> list[str]:
    """The tenant pick list: the tenants whose entries the operator may read."""
    from tasks_app import operators

    tenants = operators.tenants_where(request.user, operators.VIEW_AUDIT)
    qs = Tenant.objects.order_by("slug")
    if tenants is not None:
        qs = qs.filter(pk__in=tenants)
    return list(qs.values_list("slug", flat=True))
