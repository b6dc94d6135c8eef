"""Prometheus metrics: what every process counts, and what the database says at scrape time.

Two kinds, each where it is right:

- **Counters and histograms** (receipts, MCP requests, task and leg durations) are written by
  the process that saw the event: a gunicorn worker, a Celery pool process. They use
  prometheus-client's multiprocess mode: every process writes its own files in
  ``PROMETHEUS_MULTIPROC_DIR`` (settings puts it under the var dir and exports it before
  anything imports prometheus-client), and ``/metrics`` adds them up, so a scrape sees the
  totals of every process on its host, whichever gunicorn worker answers it.
- **Gauges of current state** (tasks by status, the dispatch backlog, effects by state, the
  worker heartbeat) are read from the database when ``/metrics`` is scraped, by
  ``DatabaseCollector``: the database is the truth, whatever process changed it, and nothing
  has to keep a gauge up to date. Each is a cheap query on an index, exact for what is still
  open and estimated past a size for what has ended, and their text is reused for
  ``TASKDESK_METRICS_DATABASE_SECONDS`` from the shared cache (``database_exposition``), so
  however many replicas are scraped, the database is read about once an interval.

The pending questions are the elicitations app's (``elicitations.metrics``); the view that
serves ``/metrics`` adds that collector to these.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import threading
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from django.conf import settings
from django.core.cache import cache
from django.db import DatabaseError
from django.db.models import Count, Min, QuerySet
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tasks_app.db.counting import (
    ColumnStatistics,
    capped_count,
    column_statistics,
    planner_estimate,
)
from tasks_app.db.counting import Count as Counted
from tasks_app.models import Dispatch, Effect, EffectState, Status, Task, WorkerHeartbeat

log = logging.getLogger(__name__)

# --- what processes count ---------------------------------------------------------------

# prometheus-client adds the ``_total`` suffix of a counter.
TASKS_ACCEPTED = Counter(
    "taskdesk_tasks_accepted",
    "Receipts handed out by tools/call: new tasks (replayed=false) and retries with a key "
    "that named an existing task (replayed=true).",
    ["tool", "replayed"],
)
TASK_DURATION = Histogram(
    "taskdesk_task_duration_seconds",
    "From acceptance to the terminal status, per tool and terminal status.",
    ["tool", "status"],
    buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600, 24 * 3600),
)
LEG_DURATION = Histogram(
    "taskdesk_leg_duration_seconds",
    "How long one leg ran (claim to end), whatever its outcome.",
    ["tool"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900),
)
MCP_REQUESTS = Counter(
    "taskdesk_mcp_requests",
    "POST /mcp requests by JSON-RPC method and outcome: ok, or the JSON-RPC error code.",
    ["method", "code"],
)
MCP_REQUEST_DURATION = Histogram(
    "taskdesk_mcp_request_duration_seconds",
    "Time to answer a POST /mcp request (to the response headers, for a stream).",
    ["method"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
MCP_ROUTING_HEADER_MISSING = Counter(
    "taskdesk_mcp_routing_header_missing",
    "2026-07-28 requests served without the Mcp-Name routing header the tasks extension asks "
    "clients to send (tasks/get, tasks/update, tasks/cancel), by JSON-RPC method.",
    ["method"],
)


# The labelled child of each metric, by its label values: ``labels()`` checks and looks them up
# under a lock on every call, twice per MCP request and twice per finished leg. The values come
# from short, fixed lists (tools, methods, codes, statuses), so the cache stays small.
_children: dict[tuple[object, ...], Any] = {}


def _child(metric: Counter | Histogram, *values: str) -> Any:
    key = (metric, *values)
    child = _children.get(key)
    if child is None:
        child = _children[key] = metric.labels(*values)
    return child


def task_accepted(*, tool: str, replayed: bool) -> None:
    _child(TASKS_ACCEPTED, tool, "true" if replayed else "false").inc()


def task_ended(*, tool: str, status: str, created_at: datetime | None, now: datetime) -> None:
    if created_at is not None:
        seconds = max((now - created_at).total_seconds(), 0.0)
        _child(TASK_DURATION, tool, status).observe(seconds)


def leg_ended(*, tool: str, seconds: float) -> None:
    _child(LEG_DURATION, tool).observe(seconds)


def mcp_request(*, method: str, code: str, seconds: float) -> None:
    _child(MCP_REQUESTS, method, code).inc()
    _child(MCP_REQUEST_DURATION, method).observe(seconds)


def mcp_routing_header_missing(*, method: str) -> None:
    _child(MCP_ROUTING_HEADER_MISSING, method).inc()


# --- what the database says --------------------------------------------------------------


def _age(then: datetime | None, now: datetime) -> float:
    return 0.0 if then is None else max((now - then).total_seconds(), 0.0)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _backlog(
    records: QuerySet[Dispatch], now: datetime, *, count: tuple[str, str], age: tuple[str, str]
) -> Iterator[Metric]:
    """Two gauges of dispatch RECORDS: how many there are (COUNT: its name and description)
    and how old the oldest is, in seconds (AGE)."""
    found = records.aggregate(n=Count("pk"), oldest=Min("created_at"))
    yield _gauge(*count, found["n"])
    yield _gauge(*age, _age(found["oldest"], now))


# /metrics counts each status exactly up to this many tasks (``DatabaseCollector._tasks``),
# and the effects of each state while the ledger holds no more than this many.
TASKS_EXACT_UP_TO = 10_000
# The effects still open: counted exactly (capped) at any size, on their partial indexes.
OPEN_EFFECT_STATES = (EffectState.INTENDED, EffectState.UNKNOWN)


class DatabaseCollector(Collector):
    """The task core's current state, read when scraped (one query per family).

    ``taskdesk_database_up`` is 0 when a query failed; the other families of this collector
    are then left out rather than reported as zero.
    """

    def collect(self) -> Iterator[Metric]:
        try:
            families = list(self._families(timezone.now()))
        except DatabaseError as exc:
            log.warning("metrics: database query failed: %s", exc)
            yield _gauge("taskdesk_database_up", "Whether /metrics could read the database.", 0)
            return
        yield _gauge("taskdesk_database_up", "Whether /metrics could read the database.", 1)
        yield from families

    def _families(self, now: datetime) -> Iterator[Metric]:
        yield from self._tasks()
        yield from self._dispatch(now)
        yield from self._effects()
        yield self._heartbeats(now)

    def _heartbeats(self, now: datetime) -> Metric:
        # The three heartbeats of /healthz. A role with no row yet is absent, not zero.
        family = GaugeMetricFamily(
            "taskdesk_worker_heartbeat_age_seconds",
            "Seconds since the newest heartbeat of each role, as /healthz reads them: legs "
            "(the workers that take legs), control (the control workers) and beat "
            "(heartbeat_job, which beat sends and a control worker runs).",
            labels=["role"],
        )
        for role, last in WorkerHeartbeat.newest_by_role().items():
            if last is not None:
                family.add_metric([role], _age(last, now))
        return family

    def _tasks(self) -> Iterator[Metric]:
        # Per status, counted on the status index up to TASKS_EXACT_UP_TO rows, PostgreSQL's
        # estimate beyond, so a scrape costs the same at a million finished tasks as at a
        # thousand; the unfinished ones are usually few, and exact. The estimates of every
        # status come from one read of the statistics (``column_statistics``: what the
        # planner would answer to an EXPLAIN of each), and only the statuses they put under
        # the limit are counted; without statistics (SQLite, a table not analyzed yet) each
        # status is a capped count.
        family = GaugeMetricFamily(
            "taskdesk_tasks",
            f"Tasks by current status (exact up to {TASKS_EXACT_UP_TO:,} a status; PostgreSQL's "
            "estimate beyond).",
            labels=["status"],
        )
        estimated = _estimated_family(
            "taskdesk_tasks_estimated", "taskdesk_tasks", "status", "that status"
        )
        statistics = column_statistics(Task, "status")
        for status in Status.values:
            guess = None if statistics is None else statistics.rows_with(status)
            counted = capped_count(
                Task.objects.filter(status=status), TASKS_EXACT_UP_TO, guess=guess
            )
            family.add_metric([status], counted.value)
            estimated.add_metric([status], int(counted.estimate))
        yield family
        yield estimated

    def _dispatch(self, now: datetime) -> Iterator[Metric]:
        # Both on partial indexes (dispatch_unpublished, dispatch_waiting_tenant).
        yield from _backlog(
            Dispatch.objects.filter(published_at__isnull=True, consumed_at__isnull=True),
            now,
            count=(
                "taskdesk_dispatch_unpublished",
                "Dispatch records no leg has taken and not yet published to the broker (the "
                "sweeper publishes them).",
            ),
            age=(
                "taskdesk_dispatch_oldest_unpublished_age_seconds",
                "Age of the oldest unpublished dispatch record (0 when there is none).",
            ),
        )
        yield from _backlog(
            Dispatch.objects.filter(consumed_at__isnull=True),
            now,
            count=(
                "taskdesk_dispatch_waiting",
                "Dispatch records no leg has taken yet: legs waiting for a worker.",
            ),
            age=(
                "taskdesk_dispatch_oldest_waiting_age_seconds",
                "Age of the oldest dispatch record no leg has taken yet (0 when there is none).",
            ),
        )

    def _effects(self) -> Iterator[Metric]:
        # A small ledger is counted exactly by one GROUP BY. Past TASKS_EXACT_UP_TO rows the
        # open states are counted on their partial indexes (effect_intended, effect_unknown)
        # up to the limit, and the settled ones, the bulk of the ledger, are PostgreSQL's
        # estimates: a GROUP BY would read every row at every scrape. As for the tasks, the
        # size of the ledger and the estimate of each state come from one read of the
        # statistics where there are some.
        family = GaugeMetricFamily(
            "taskdesk_effects",
            f"Effects in the ledger by state (intended and unknown exact; the others exact "
            f"up to {TASKS_EXACT_UP_TO:,} effects in all, PostgreSQL's estimate beyond).",
            labels=["state"],
        )
        estimated = _estimated_family(
            "taskdesk_effects_estimated", "taskdesk_effects", "state", "that state"
        )
        effects = Effect.objects.order_by()
        statistics = column_statistics(Effect, "state")
        size = None if statistics is None else statistics.rows
        counts: dict[str, Counted]
        if not capped_count(effects, TASKS_EXACT_UP_TO, guess=size).estimate:
            exact = dict(
                effects.values_list("state").annotate(n=Count("pk")).values_list("state", "n")
            )
            counts = {state: Counted(exact.get(state, 0)) for state in EffectState.values}
        else:
            counts = {
                state: _effect_count(effects.filter(state=state), state, statistics)
                for state in EffectState.values
            }
        for state, counted in counts.items():
            family.add_metric([state], counted.value)
            estimated.add_metric([state], int(counted.estimate))
        yield family
        yield estimated


def _effect_count(
    effects: QuerySet[Effect], state: str, statistics: ColumnStatistics | None
) -> Counted:
    """How many of a large ledger's EFFECTS (those in STATE) /metrics shows: an open state
    counted up to the limit, a settled one estimated (no index would make counting it
    cheap)."""
    guess = None if statistics is None else statistics.rows_with(state)
    if state in OPEN_EFFECT_STATES:
        return capped_count(effects, TASKS_EXACT_UP_TO, guess=guess)
    return Counted(planner_estimate(effects) if guess is None else guess, estimate=True)


def _estimated_family(name: str, of: str, label: str, which: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(
        name,
        f"1 where {of} of {which} is PostgreSQL's estimate, 0 where it is an exact count.",
        labels=[label],
    )


# --- the scrape ----------------------------------------------------------------------------


def exposition(collectors: Sequence[Collector]) -> bytes:
    """The Prometheus text of every process's counters and histograms (this host's
    multiprocess folder) and of COLLECTORS, the database's gauges (``database_exposition``)."""
    registry = CollectorRegistry(auto_describe=False)
    folder = str(settings.PROMETHEUS_MULTIPROC_DIR)
    multiprocess.MultiProcessCollector(registry, path=folder)  # type: ignore[no-untyped-call]
    text = generate_latest(registry)
    return text + database_exposition(collectors) if collectors else text


# Where the database gauges' text is kept between scrapes (the shared cache: Redis or the
# database in production, so every web replica finds what one of them read).
DATABASE_GAUGES_KEY = "metrics:database-gauges"


def database_exposition(collectors: Sequence[Collector]) -> bytes:
    """The Prometheus text of COLLECTORS, read from the database at most once every
    ``TASKDESK_METRICS_DATABASE_SECONDS`` by all the processes sharing the cache. A cache
    that cannot be reached only means reading the database each time."""
    keep = settings.TASKDESK_METRICS_DATABASE_SECONDS
    if keep > 0:
        try:
            kept = cache.get(DATABASE_GAUGES_KEY)
        except Exception as exc:  # the cache is down: read the database, as without one
            log.warning("metrics: the shared cache could not be read: %s", exc)
            kept = None
        if isinstance(kept, bytes):
            return kept
    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)
    text = generate_latest(registry)
    if keep > 0:
        try:
            cache.set(DATABASE_GAUGES_KEY, text, keep)
        except Exception as exc:
            log.warning("metrics: the shared cache could not be written: %s", exc)
    return text


CONTENT_TYPE = CONTENT_TYPE_LATEST


# --- a worker node's own /metrics ------------------------------------------------------------


def serve_worker_metrics(host: str, port: int) -> WSGIServer:
    """Serve this host's multiprocess counters and histograms (a worker's pool writes its leg
    and task durations there) at ``/metrics`` on HOST:PORT, from a daemon thread; the same
    rule as the web's /metrics: ``TASKDESK_METRICS_TOKEN`` as a bearer token, or, without
    one, loopback callers only. Return the server (``shutdown()`` stops it)."""
    server = make_server(host, port, _worker_metrics_app, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="worker-metrics", daemon=True).start()
    return server


def _worker_metrics_app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    if environ.get("PATH_INFO") != "/metrics":
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"Not found: the metrics are at /metrics.\n"]
    token = settings.TASKDESK_METRICS_TOKEN
    scheme, _, sent = str(environ.get("HTTP_AUTHORIZATION", "")).partition(" ")
    if token:
        allowed = scheme.lower() == "bearer" and hmac.compare_digest(
            sent.strip().encode("utf-8", "surrogatepass"), token.encode("utf-8")
        )
    else:
        allowed = _loopback(str(environ.get("REMOTE_ADDR", "")))
    if not allowed:
        start_response("401 Unauthorized", [("Content-Type", "text/plain"),
                                             ("WWW-Authenticate", 'Bearer realm="metrics"')])  # fmt: skip
        return [b"Send TASKDESK_METRICS_TOKEN as a bearer token to read /metrics.\n"]
    start_response("200 OK", [("Content-Type", CONTENT_TYPE)])
    return [exposition([])]


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # a scrape is not worth a line
        pass


_FORWARDING_HEADERS = ("HTTP_X_FORWARDED_FOR", "HTTP_FORWARDED", "HTTP_X_REAL_IP")


def refusal(request: HttpRequest) -> HttpResponse | None:
    """Why REQUEST may not read /metrics, as the response to send; None if it may.

    With ``TASKDESK_METRICS_TOKEN`` set, the caller must send it as a bearer token. Without
    one, only loopback callers may, and a request a proxy forwarded (it names the original
    client in a forwarding header) is not taken as loopback, whatever its socket address.
    """
    token = settings.TASKDESK_METRICS_TOKEN
    if token:
        if sends_token(request):
            return None
        response = JsonResponse(
            {"error": "Send TASKDESK_METRICS_TOKEN as a bearer token to read /metrics."},
            status=401,
        )
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    if _loopback(request.META.get("REMOTE_ADDR", "")) and not any(
        name in request.META for name in _FORWARDING_HEADERS
    ):
        return None
    return JsonResponse(
        {
            "error": "/metrics answers only loopback callers while TASKDESK_METRICS_TOKEN is "
            "not set; set it and send it as a bearer token."
        },
        status=403,
    )


def sends_token(request: HttpRequest) -> bool:
    """Whether REQUEST sends ``TASKDESK_METRICS_TOKEN`` (set) as its bearer token. Compared as
    UTF-8 bytes: a token with characters outside ASCII is a wrong token, not an error."""
    token = settings.TASKDESK_METRICS_TOKEN
    if not token:
        return False
    scheme, _, sent = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        sent.strip().encode("utf-8", "surrogatepass"), token.encode("utf-8")
    )


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False
