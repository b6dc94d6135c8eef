from __future__ import annotations

from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.templatetags.static import static
from django.views.decorators.cache import cache_control, never_cache
from django.views.decorators.http import require_GET

from elicitations.metrics import PendingQuestionsCollector
from tasks_app import health, metrics


def _health(request: HttpRequest, scope: str) -> JsonResponse:
    ok, body = health.report(scope)
    # A probe (/readyz) is answered before the session and the user are read (ProbeMiddleware).
    user = getattr(request, "user", None)
    if metrics.sends_token(request) or (
        user is not None and user.is_authenticated and user.is_staff
    ):
        pass  # the monitoring token, or staff: everything, exception text included
    elif user is not None and user.is_authenticated:
        body = health.redacted(body)  # exception text is for staff only
    else:
        body = health.anonymous(body)  # the vendor, broker and heartbeats are not public
    return JsonResponse(body, status=200 if ok else 503)


@require_GET
@never_cache
def healthz(request: HttpRequest) -> JsonResponse:
    """The deployment: database, broker, workers and beat (a heartbeat that never reported is
    not a failure). With ``?strict=1``: every heartbeat must have reported, recently (the
    deployment can do work now)."""
    strict = request.GET.get("strict") == "1"
    return _health(request, health.STRICT if strict else health.DEPLOYMENT)


@require_GET
@never_cache
def readyz(request: HttpRequest) -> JsonResponse:
    """Whether this web process can serve: its database and its broker (a stopped worker or
    beat does not take it out of service: /healthz says so). 503 when either fails."""
    return _health(request, health.WEB)


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
