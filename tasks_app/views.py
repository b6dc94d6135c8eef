from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from elicitations.selectors import input_requests_of_task
from tasks_app import health, selectors
from tasks_app.operators import operator_login_required


@require_GET
@never_cache
def healthz(request: HttpRequest) -> JsonResponse:
    ok, body = health.report()
    return JsonResponse(body, status=200 if ok else 503)


@require_GET
@operator_login_required
def task_detail(request: HttpRequest, task_id: str) -> HttpResponse:
    """One task for an operator: status, arguments, result, questions, effects, timeline."""
    try:
        task = selectors.task_get_for_operator(user=request.user, task_id=task_id)
    except selectors.TaskNotFound:
        raise Http404("No such task.") from None
    context = {
        "task": task,
        "input_requests": input_requests_of_task(task_id=task.pk),
        "effects": task.effects.order_by("seq"),
        "events": task.events.order_by("created_at", "pk"),
    }
    template = "tasks_app/task_detail.html"
    if getattr(request, "htmx", False):
        template += "#task_body"
    return render(request, template, context)
