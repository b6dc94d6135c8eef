"""The deliveries page of a client: its webhook endpoints and the latest messages sent to
them, each with its attempts, and "Send again" (``outbox.send_again``: the same message id
and body, due now).

Tenant-scoped like the other console pages: a client whose tasks the operator may not see
does not exist for them; sending again needs the operator role's permission in its tenant.
"""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from tasks_app import operators, outbox, selectors
from tasks_app.models import Channel, Client, OutboxMessage
from tasks_app.operators import operator_login_required

PAGE = 100


def _client_or_404(request: HttpRequest, client_id: int) -> Client:
    visible = selectors.client_ids_visible_to(request.user)
    if visible is not None and client_id not in visible:
        raise Http404("No such client.")
    try:
        return Client.objects.select_related("tenant").get(pk=client_id)
    except Client.DoesNotExist:
        raise Http404("No such client.") from None


@require_GET
@operator_login_required
def client_deliveries(request: HttpRequest, client_id: int) -> HttpResponse:
    client = _client_or_404(request, client_id)
    recent = (
        OutboxMessage.objects.filter(channel=Channel.WEBHOOK, endpoint__client=client)
        .select_related("endpoint")
        .prefetch_related("tries")
        .order_by("-created_at", "-pk")[:PAGE]
    )
    context = {
        "client": client,
        "endpoints": list(client.webhook_endpoints.order_by("pk")),
        "deliveries": list(recent),
        "can_resend": operators.may(request.user, operators.RESEND_WEBHOOKS, client.tenant_id),
        "nav": "tasks",
    }
    return render(request, "tasks_app/client_deliveries.html", context)


@require_POST
@operator_login_required
def delivery_send_again(request: HttpRequest, client_id: int, message_id: int) -> HttpResponse:
    client = _client_or_404(request, client_id)
    message = OutboxMessage.objects.filter(
        pk=message_id, channel=Channel.WEBHOOK, endpoint__client=client
    ).first()
    if message is None:
        raise Http404("No such delivery.")
    if not operators.may(request.user, operators.RESEND_WEBHOOKS, client.tenant_id):
        raise PermissionDenied("Your role does not allow this.")
    outbox.send_again(message)
    messages.success(request, f"{message.kind} ({message.message_id}) will be sent again.")
    return redirect("client_deliveries", client_id=client.pk)
