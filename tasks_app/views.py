from __future__ import annotations

from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.templatetags.static import static
from django.views.decorators.cache import cache_control, never_cache
from django.views.decorators.http import require_GET

from elicitations.metrics import PendingQuestionsCollector
from tasks_app import health, metrics


def _health(request: HttpRequest, *, ready: bool) -> JsonResponse:
    ok, body = health.report(ready=ready)
    if metrics.sends_token(request) or (request.user.is_authenticated and request.user.is_staff):
        pass  # the monitoring token, or staff: everything, exception text included
    elif request.user.is_authenticated:
        body = health.redacted(body)  # exception text is for staff only
    else:
        body = health.anonymous(body)  # the vendor, broker and heartbeats are not public
    return JsonResponse(body, status=200 if ok else 503)


@require_GET
@never_cache
def healthz(request: HttpRequest) -> JsonResponse:
    """Database, broker, workers and beat (a heartbeat that never reported is not a
    failure)."""
    return _health(request, ready=False)


@require_GET
@never_cache
def readyz(request: HttpRequest) -> JsonResponse:
    """Whether this deployment can do work now: database, broker, and a fresh heartbeat of
    a worker taking legs, of a control worker and of beat (its heartbeat job, run by a
    control worker). 503 when any fails, or one of the heartbeats never reported."""
    return _health(request, ready=True)


@require_GET
@never_cache
def livez(request: HttpRequest) -> JsonResponse:
    """The process answers. Touches nothing else, so a database outage does not get a
    healthy web process restarted."""
    return JsonResponse({"status": "ok"})


@require_GET
@never_cache
def metrics_view(request: HttpRequest) -> HttpResponse:
    """``/metrics`` in the Prometheus text format (``tasks_app.metrics``)."""
    refused = metrics.refusal(request)
    if refused is not None:
        return refused
    body = metrics.exposition([metrics.DatabaseCollector(), PendingQuestionsCollector()])
    return HttpResponse(body, content_type=metrics.CONTENT_TYPE)


@require_GET
@cache_control(max_age=86400, public=True)
def favicon(request: HttpRequest) -> HttpResponse:
    """``/favicon.ico``, which browsers ask for on pages that name no icon (the admin's): the
    static file (a redirect, so that it is served, compressed and cached like the others)."""
    return HttpResponseRedirect(static("favicon.ico"))
