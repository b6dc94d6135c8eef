"""The workers page at /workers/: every worker node with its pool and heartbeat, the legs it
runs now and ended in the last minute, beat, and the legs waiting for a worker per queue and
per tenant (``listing.workers``), refreshed while the tab is visible.

Open to whoever may see tasks in some tenant (``operators.VIEW_TASKS``; superusers always):
the nodes are shared, the legs and the backlog are those of the operator's tenants.
"""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.urls import reverse
from django.views.decorators.http import require_GET

from tasks_app import selectors
from tasks_app.console.pages import NOT_PERMITTED, url
from tasks_app.listing.workers import workers_for_operator
from tasks_app.operators import HtmxHttpRequest, change_token, operator_login_required

TEMPLATE = "tasks_app/workers.html"


@require_GET
@operator_login_required
def workers(request: HtmxHttpRequest) -> HttpResponse:
    try:
        seen = workers_for_operator(user=request.user)
    except selectors.NotPermitted:
        raise PermissionDenied(NOT_PERMITTED) from None
    context = {"seen": seen, "nav": "workers", "task_prefix": reverse("task_list")}
    # The change token is a digest of what the region shows (its spans are coarse: see
    # templatetags.console.coarse_span), so a poll is answered with 204 exactly when a fresh
    # rendering would look the same.
    state = render_to_string(f"{TEMPLATE}#worker_state", context, request=request)
    version = change_token(state)
    if request.htmx and request.GET.get("since") == version:
        return HttpResponse(status=204)
    context.update(state=state, poll_url=url("workers", {"since": version}))
    return render(request, f"{TEMPLATE}#workers" if request.htmx else TEMPLATE, context)
