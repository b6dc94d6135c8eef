"""Benchmark of the operator console at a million tasks (``make bench``).

Creates its own PostgreSQL database, migrates it, and seeds 1,000,000 tasks over 20 clients in
2 tenants, accepted over the last 30 days: the newest few hours hold the running tasks (40 %
working, 10 % waiting for input), older ones are mostly finished (about 93 % completed, 4 %
failed, 3 % cancelled, a few stuck); one completed task in 40 ended with a tool error. Half
carry an idempotency key (``order-N``), in both tenants; tools are drawn with a skew (the
first, ``export_report``, about a third of the tasks; the last, ``rebuild_index``, 6 %). 200 tasks have an effect in state ``unknown``, about a
third of the completed ones a confirmed effect, and 100 a question past its deadline. Then, in this process, it times the server side of the dashboard
(the Django view through the test client: middleware, queries and template, no network) for a
tenant operator (the tenant holds half the tasks) and for a superuser (every task):

- the first page of /tasks/, a status-filtered page, a tool-filtered page, the tool errors, a
  date range, and the page 100 pages deep reached by following the cursor (each page also
  computes the counts, the attention count and the throughput chart);
- searches: part of a key that a handful of tasks have, part of a key that a tenth of them
  have, a status message's word, a tool's name, an id's first characters;
- the list sorted by duration (first page and 20 pages deep), by tool and by status;
- the counts per status and the attention count on their own (the selectors);
- a scrape of ``/metrics`` that reads the database's gauges (not the copy the replicas share
  for ``TASKDESK_METRICS_DATABASE_SECONDS``: the cost of the one scrape an interval that reads),
  by Prometheus: anonymous, from loopback.

Each user's requests, and Prometheus', go through one test client, as a web process's go
through one handler: a client loads the middleware on its first request, where WhiteNoise
indexes every static file (about 30 ms, up to 100 at the p95: more than the scrape itself).

Each figure is the p50 and p95 of BENCH_REPEAT (default 50) requests after 5 warm-up ones.
Target: p95 under 100 ms each. Prints the figures and writes them into docs/benchmarks.md.

Environment: BENCH_POSTGRES (default postgres://postgres@127.0.0.1:5432), BENCH_TASKS
(default 1000000), BENCH_REPEAT, BENCH_NO_DOCS=1 to leave the docs alone. While working on one
figure: BENCH_DATABASE=NAME keeps the seeded database under NAME after the run and reuses it in
the next ones (seeding takes about a minute; drop it by hand when done), and BENCH_ONLY=TEXT
times only the measurements whose name contains TEXT (``/metrics``, ``export``...) and leaves
the docs alone.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import DOCS, POSTGRES, database, manage, say
from bench.runtime import machine_line

START, END = "<!-- dashboard-bench:start -->", "<!-- dashboard-bench:end -->"
TASKS = int(os.environ.get("BENCH_TASKS", "1000000"))
REPEAT = int(os.environ.get("BENCH_REPEAT", "50"))
KEPT_DATABASE = os.environ.get("BENCH_DATABASE", "")
ONLY = os.environ.get("BENCH_ONLY", "")
TARGET_MS = 100.0
EXPORT_SECONDS, EXPORT_MB = 60, 50
TOOLS = ["export_report", "refund_payment", "send_notice", "slow_echo", "confirm_action",
         "sync_inventory", "deploy_release", "rebuild_index"]  # fmt: skip

SEED = """
INSERT INTO tasks_app_tenant (slug, created_at) VALUES ('north', now()), ('south', now());
INSERT INTO tasks_app_client (name, tenant_id, created_at, allowed_tools)
SELECT 'client-' || lpad(i::text, 2, '0'),
       (SELECT id FROM tasks_app_tenant WHERE slug = CASE WHEN i % 2 = 0 THEN 'north' ELSE 'south' END),
       now(), '[]'::jsonb
FROM generate_series(1, 20) AS i;

-- Task g = 1 is the newest; one is accepted every 30 days / N.
INSERT INTO tasks_app_task (id, client_id, tool_name, arguments, fingerprint, idempotency_key,
    status, status_message, era, poll_interval_ms, leg, lease_owner, created_at, updated_at,
    finished_at, is_error, result, stored_bytes)
SELECT md5('task' || g), c.id, t.tool, '{{}}'::jsonb, md5('fp' || g),
       CASE WHEN g % 4 < 2 THEN 'order-' || g END,
       s.status,
       CASE s.status WHEN 'working' THEN 'step 3 of 10' WHEN 'failed' THEN 'provider refused'
                     WHEN 'input_required' THEN 'Confirm the deploy' ELSE '' END,
       '2026-07-28', 1000, 1, '', s.created, s.created + interval '5 seconds',
       CASE WHEN s.status IN ('completed', 'failed', 'cancelled')
            THEN s.created + (random() * 120) * interval '1 second' END,
       s.status = 'completed' AND g % 40 = 7,
       r.result, 2 + coalesce(octet_length(r.result::text), 0)
FROM generate_series(1, {n}) AS g
CROSS JOIN LATERAL (
    SELECT now() - (g - 1) * (interval '30 days' / {n}) AS created, random() AS r
) AS a
CROSS JOIN LATERAL (
    SELECT a.created,
        CASE WHEN g <= {recent} THEN
            CASE WHEN a.r < 0.40 THEN 'working' WHEN a.r < 0.50 THEN 'input_required'
                 WHEN a.r < 0.54 THEN 'failed' WHEN a.r < 0.57 THEN 'cancelled'
                 ELSE 'completed' END
        ELSE
            CASE WHEN a.r < 0.002 THEN 'working' WHEN a.r < 0.003 THEN 'input_required'
                 WHEN a.r < 0.043 THEN 'failed' WHEN a.r < 0.073 THEN 'cancelled'
                 ELSE 'completed' END
        END AS status
) AS s
CROSS JOIN LATERAL (
    SELECT CASE WHEN s.status = 'completed' AND g % 40 = 7 THEN jsonb_build_object(
            'content', jsonb_build_array(jsonb_build_object(
                'type', 'text', 'text', 'Refund of p-' || g || ' was not approved')),
            'isError', true) END AS result
) AS r
JOIN tasks_app_client c ON c.name = 'client-' || lpad((1 + (g * 7) % 20)::text, 2, '0')
CROSS JOIN LATERAL (
    -- "+ 0 * g" ties the draw to the row: without it the subquery is run once, for all rows.
    SELECT (ARRAY{tools})[1 + floor(power(random(), 2) * {tool_count} + 0 * g)::int] AS tool
) AS t;

INSERT INTO tasks_app_effect (task_id, seq, name, target, downstream_key, state, compensable,
    detail, created_at, updated_at)
SELECT id, 1, 'send_notice', 'ops@example.com', id || ':send_notice:1', 'unknown', false,
       '{{}}'::jsonb, created_at, created_at
FROM tasks_app_task WHERE status = 'working' ORDER BY created_at DESC LIMIT 200;

-- The ledger of a busy deployment: a confirmed effect for about a third of the completed tasks.
INSERT INTO tasks_app_effect (task_id, seq, name, target, downstream_key, state, compensable,
    detail, created_at, updated_at)
SELECT id, 1, 'refund', 'psp', id || ':refund:1', 'confirmed', true, '{{}}'::jsonb,
       created_at, created_at
FROM tasks_app_task WHERE status = 'completed' AND id < '5';

INSERT INTO elicitations_inputrequest (task_id, key, ask_key, mode, message, property_order,
    url, audience, status, channel, deadline, on_timeout, created_at)
SELECT id, id || ':q', 'approval', 'form', 'Approve?', '[]'::jsonb, '', 'operator', 'pending',
       '', now() - interval '5 minutes', 'decline', created_at
FROM tasks_app_task WHERE status = 'working' ORDER BY created_at DESC OFFSET 200 LIMIT 100;
"""


def seed(dsn: str) -> float:
    """Seed the database at DSN and return the seconds it took. A database kept from an earlier
    run (BENCH_DATABASE) that holds the same number of tasks is not seeded again: the seconds
    are those of its seeding, which it keeps as its comment."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        held = conn.execute("SELECT count(*) FROM tasks_app_task").fetchone()
        noted = conn.execute(
            "SELECT shobj_description(oid, 'pg_database') FROM pg_database "
            "WHERE datname = current_database()"
        ).fetchone()
    if held and held[0]:
        if held[0] == TASKS and noted and noted[0]:
            say(f"reusing the {TASKS:,} tasks seeded earlier")
            return float(noted[0].removeprefix("seeded in ").removesuffix(" s"))
        sys.exit(f"bench: the database at {dsn} holds {held[0]:,} tasks, not {TASKS:,}: drop it")
    started = time.monotonic()
    sql = SEED.format(
        n=TASKS,
        recent=max(1, TASKS // 200),
        tools="[" + ",".join(f"'{t}'" for t in TOOLS) + "]",
        tool_count=len(TOOLS),
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql)
        conn.execute("VACUUM ANALYZE")
        seconds = time.monotonic() - started
        if KEPT_DATABASE:
            note = f"seeded in {seconds:.1f} s"
            conn.execute(f"COMMENT ON DATABASE \"{KEPT_DATABASE}\" IS '{note}'")
    return seconds


def wanted(name: str) -> bool:
    return ONLY in name


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def timed(fn: Callable[[], Any]) -> tuple[float, float]:
    for _ in range(5):
        fn()
    samples = []
    for _ in range(REPEAT):
        started = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples), percentile(samples, 0.95)


@dataclass(frozen=True)
class Export:
    rows: int
    seconds: float
    memory_mb: float


def measure() -> tuple[dict[str, dict[str, tuple[float, float]]], dict[str, Export]]:
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.test import Client, override_settings

    from elicitations.selectors import overdue_task_ids
    from tasks_app import listing, selectors
    from tasks_app.models import Task, Tenant
    from tasks_app.operators import grant_role

    prometheus = Client(HTTP_HOST="127.0.0.1")  # loopback: no token

    def scrape_metrics() -> None:
        with override_settings(TASKDESK_METRICS_DATABASE_SECONDS=0):  # read, not reused
            response = prometheus.get("/metrics")
        assert response.status_code == 200, response.status_code
        assert b"taskdesk_database_up 1.0" in response.content

    User = get_user_model()
    User.objects.filter(username__in=("olga", "root")).delete()  # a kept database's
    operator = User.objects.create_user("olga", password=secrets.token_urlsafe(12))
    Tenant.objects.get(slug="north").members.add(operator)
    grant_role(operator, "operator")
    root = User.objects.create_superuser("root", password=secrets.token_urlsafe(12))

    results: dict[str, dict[str, tuple[float, float]]] = {}
    exports: dict[str, Export] = {}
    for label, user in (("tenant operator", operator), ("superuser", root)):
        web = Client(HTTP_HOST="127.0.0.1")
        web.force_login(user)

        def get(url: str, web: Client = web) -> str:
            response = web.get(url)
            assert response.status_code == 200, (url, response.status_code)
            return response.content.decode()

        deep = "/tasks/"
        for _ in range(99 if wanted("page 100 pages deep") else 0):  # the 100th page
            html = get(deep)
            deep = html.split('id="page-older" href="', 1)[1].split('"', 1)[0]
            deep = deep.replace("&amp;", "&")
        filters = listing.TaskFilters()

        def counts(user: Any = user, filters: Any = filters) -> None:
            listing.task_counts_for_operator(user=user, filters=filters)

        def attention(user: Any = user, filters: Any = filters) -> None:
            found = selectors.attention_filter(overdue_task_ids=overdue_task_ids())
            listing.attention_count_for_operator(user=user, filters=filters, attention=found)

        by_duration = "/tasks/?sort=-duration"
        for _ in range(19 if wanted("page 20") else 0):  # the 20th page sorted by duration
            html = get(by_duration)
            by_duration = html.split('id="page-older" href="', 1)[1].split('"', 1)[0]
            by_duration = by_duration.replace("&amp;", "&")
        # Ten days in the middle of the thirty.
        newest = Task.objects.order_by("-created_at").values_list("created_at", flat=True)[0]
        window = (
            f"from={(newest - timedelta(days=20)).date()}&to={(newest - timedelta(days=11)).date()}"
        )
        north = Task.objects.filter(client__tenant__slug="north").order_by("-created_at")
        some_id = north.values_list("pk", flat=True)[61_728][:8]  # visible to both

        say(f"measuring as {label}")
        pages = {
            "first page": "/tasks/",
            "status-filtered page (failed)": "/tasks/?status=failed",
            "tool-filtered page (deploy_release)": "/tasks/?tool=deploy_release",
            "tool errors (?outcome=tool_error)": "/tasks/?outcome=tool_error",
            "ten days (?from=&to=)": f"/tasks/?{window}",
            "search: rare key text (q=424242)": "/tasks/?q=424242",
            "search: common key text (q=order-1)": "/tasks/?q=order-1",
            "search: status message (q=provider)": "/tasks/?q=provider",
            "search: tool name (q=refund)": "/tasks/?q=refund",
            "search: an id's first 8 characters": f"/tasks/?q={some_id}",
            "sorted by duration": "/tasks/?sort=-duration",
            "sorted by duration, page 20 (by cursor)": by_duration,
            "sorted by tool": "/tasks/?sort=tool",
            "sorted by status": "/tasks/?sort=-status",
        }
        pages["page 100 pages deep (by cursor)"] = deep
        calls: dict[str, Callable[[], Any]] = {
            name: lambda url=url: get(url) for name, url in pages.items()
        }
        calls["counts per status"] = counts
        calls["attention count"] = attention
        calls["/metrics, its database gauges read"] = scrape_metrics
        results[label] = {name: timed(call) for name, call in calls.items() if wanted(name)}
        if wanted("export"):
            exports[label] = export_figures(web)
    return results, exports


def _status_kb(name: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{name}:"):
            return int(line.split()[1])
    raise LookupError(name)


def export_figures(web: Any) -> Export:
    """Stream the whole list as CSV (/tasks/export.csv) through WEB: its rows, the seconds
    it took and how far this process's resident memory rose above where it started."""
    Path("/proc/self/clear_refs").write_text("5")  # resets the peak (VmHWM) to the current
    base = _status_kb("VmRSS")
    started = time.perf_counter()
    response = web.get("/tasks/export.csv")
    assert response.status_code == 200, response.status_code
    lines = sum(piece.count(b"\n") for piece in response.streaming_content)
    seconds = time.perf_counter() - started
    return Export(lines - 1, seconds, (_status_kb("VmHWM") - base) / 1024)


def explain_counts(dsn: str) -> str:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT status, count(*) FROM tasks_app_task GROUP BY status ORDER BY 2 DESC"
        ).fetchall()
    return ", ".join(f"{status} {n:,}" for status, n in rows)


def render(results: dict[str, dict[str, tuple[float, float]]], exports: dict[str, Export],
           machine: str, mix: str, seed_seconds: float) -> str:  # fmt: skip
    lines = [
        f"_Run of {datetime.now(UTC):%Y-%m-%d} (`make bench`, bench/dashboard.py):_",
        "",
        f"Machine: {machine}.",
        f"Data: {TASKS:,} tasks over 20 clients in 2 tenants, accepted over 30 days ({mix}); "
        f"200 with an unknown effect, about a third of the completed ones a confirmed effect, "
        f"100 with a question past its deadline; seeded and "
        f"analyzed in {seed_seconds:.0f} s. Server time: the Django view through the test "
        f"client in one process (middleware, queries, template; no network), p50 / p95 of "
        f"{REPEAT} requests after 5 warm-up ones. Each page also computes the counts, the "
        "attention count and the throughput chart.",
        "",
        "| measurement | tenant operator (half the tasks) p50 / p95 ms | superuser (all) "
        "p50 / p95 ms | target |",
        "| --- | ---: | ---: | --- |",
    ]
    names = list(next(iter(results.values())))
    for name in names:
        cells = []
        worst = 0.0
        for label in ("tenant operator", "superuser"):
            p50, p95 = results[label][name]
            worst = max(worst, p95)
            cells.append(f"{p50:.1f} / {p95:.1f}")
        verdict = "met" if worst < TARGET_MS else "**not met**"
        lines.append(f"| {name} | {cells[0]} | {cells[1]} | p95 < {TARGET_MS:.0f} ms ({verdict}) |")
    if not exports:
        return "\n".join(lines)
    lines += [
        "",
        "The whole list exported as CSV (`/tasks/export.csv`, streamed; read to the end through "
        "the test client once; memory: the rise of this process's peak resident set above "
        "where it stood before the export):",
        "",
        "| who | rows | seconds | rows/s | memory | target |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for label, export in exports.items():
        met = export.seconds < EXPORT_SECONDS and export.memory_mb < EXPORT_MB
        lines.append(
            f"| {label} | {export.rows:,} | {export.seconds:.1f} | "
            f"{export.rows / export.seconds:,.0f} | {export.memory_mb:.0f} MB | "
            f"under {EXPORT_SECONDS} s and {EXPORT_MB} MB ({'met' if met else '**not met**'}) |"
        )
    return "\n".join(lines)


def write_docs(table: str) -> None:
    text = DOCS.read_text() if DOCS.exists() else "# Benchmarks\n"
    block = f"{START}\n{table}\n{END}"
    if START in text and END in text:
        head, rest = text.split(START, 1)
        text = head + block + rest.split(END, 1)[1]
    else:
        text = text.rstrip() + "\n\n## The operator console at a million tasks\n\n" + block + "\n"
    DOCS.write_text(text)


@contextlib.contextmanager
def kept(name: str) -> Iterator[str]:
    """The database NAME, created if it is not there yet, and left there after the run."""
    with psycopg.connect(f"{POSTGRES}/postgres", autocommit=True) as admin:
        if not admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            admin.execute(f'CREATE DATABASE "{name}"')
    yield f"{POSTGRES}/{name}"


def main() -> None:
    machine = machine_line()
    workdir = Path(tempfile.mkdtemp(prefix="taskdesk-bench-dashboard-"))
    with kept(KEPT_DATABASE) if KEPT_DATABASE else database("taskdesk_bench_dashboard") as dsn:
        env = {
            **os.environ,
            "DATABASE_URL": dsn,
            "SECRET_KEY": secrets.token_urlsafe(50),
            "TASKDESK_VAR_DIR": str(workdir),
            "DJANGO_SETTINGS_MODULE": "config.settings",
        }
        env.pop("DEBUG", None)
        say("migrating")
        manage(env, "migrate", "--noinput")
        manage(env, "collectstatic", "--noinput", "-v0")
        say(f"seeding {TASKS:,} tasks")
        seed_seconds = seed(dsn)
        mix = explain_counts(dsn)
        say(f"seeded in {seed_seconds:.0f} s: {mix}")
        os.environ.update({k: env[k] for k in ("DATABASE_URL", "SECRET_KEY", "TASKDESK_VAR_DIR")})
        os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
        os.environ.pop("DEBUG", None)
        results, exports = measure()
        machine += f" and {os.getloadavg()[0]:.2f} at the end"
        from django.db import connections

        connections.close_all()
    table = render(results, exports, machine, mix, seed_seconds)
    print(table)
    if not os.environ.get("BENCH_NO_DOCS") and not ONLY:
        write_docs(table)


if __name__ == "__main__":
    main()
