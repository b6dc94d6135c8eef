"""The deliveries page of a client: its webhook endpoints and the latest messages sent to
them, each with its attempts, and "Send again" (``outbox.send_again``: the same message id
and body, due now).

Tenant-scoped like the other console pages: a client whose tasks the operator may not see
does not exist for them; sending again needs the operator role's permission in its tenant.
"""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from tasks_app import audit, operators, outbox, selectors
from tasks_app.console.pages import NOT_PERMITTED
from tasks_app.models import AuditAction, Client
from tasks_app.operators import HtmxHttpRequest, operator_login_required

PAGE = 100


def _client_or_404(request: HtmxHttpRequest, client_id: int) -> Client:
    try:
        return selectors.client_get_for_operator(user=request.user, client_id=client_id)
    except selectors.ClientNotFound:
        raise Http404("No such client.") from None


@require_GET
@operator_login_required
def client_deliveries(request: HtmxHttpRequest, client_id: int) -> HttpResponse:
    client = _client_or_404(request, client_id)
    context = {
        "client": client,
        "endpoints": list(client.webhook_endpoints.order_by("pk")),
        "deliveries": selectors.webhook_deliveries_of(client, limit=PAGE),
        "can_resend": operators.may(request.user, operators.RESEND_WEBHOOKS, client.tenant_id),
        "nav": "tasks",
    }
    return render(request, "tasks_app/client_deliveries.html", context)


@require_POST
@operator_login_required
def delivery_send_again(request: HtmxHttpRequest, client_id: int, message_id: int) -> HttpResponse:
    client = _client_or_404(request, client_id)
    message = selectors.webhook_delivery_of(client, message_id)
    if message is None:
        raise Http404("No such delivery.")
    if not operators.may(request.user, operators.RESEND_WEBHOOKS, client.tenant_id):
        raise PermissionDenied(NOT_PERMITTED)
    with transaction.atomic():
        outbox.send_again(message)
        audit.record(audit.Who.of(request), AuditAction.WEBHOOK_RESEND, tenant=client.tenant_id,
                     target=f"client:{client.pk}", message=message.message_id, kind=message.kind,
                     task=message.task_id or "")  # fmt: skip
    messages.success(request, f"{message.kind} ({message.message_id}) will be sent again.")
    return redirect("client_deliveries", client_id=client.pk)
