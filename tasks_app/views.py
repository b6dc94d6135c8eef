from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from tasks_app import health
from tasks_app.dashboard import effect_reconcile, task_cancel, task_detail, task_list

# The operator console's views live in tasks_app.dashboard.
__all__ = ["effect_reconcile", "healthz", "task_cancel", "task_detail", "task_list"]


@require_GET
@never_cache
def healthz(request: HttpRequest) -> JsonResponse:
    ok, body = health.report()
    return JsonResponse(body, status=200 if ok else 503)
