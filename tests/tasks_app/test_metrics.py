"""/metrics: who may read it, the gauges read from the database, the counters of processes."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from tasks_app import acceptance
from tasks_app.models import Dispatch, Effect, Status, Task, WorkerHeartbeat
from tasks_app.tasks import heartbeat_job
from tasks_app.tools import get_tool


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition, keyed by (name, sorted labels)."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def scrape(client, **extra) -> dict:  # type: ignore[no-untyped-def]
    response = client.get("/metrics", **extra)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    return samples(response.content.decode())


def value(found: dict, name: str, **labels: str) -> float:  # type: ignore[type-arg]
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


# --- who may read it ----------------------------------------------------------------------


def test_a_loopback_caller_reads_it_without_a_token(client, db) -> None:  # type: ignore[no-untyped-def]
    found = scrape(client)  # the test client's REMOTE_ADDR is 127.0.0.1

    assert value(found, "taskdesk_database_up") == 1


def test_without_a_token_a_remote_caller_is_refused(client, db) -> None:  # type: ignore[no-untyped-def]
    response = client.get("/metrics", REMOTE_ADDR="10.1.2.3")

    assert response.status_code == 403
    assert "TASKDESK_METRICS_TOKEN" in response.json()["error"]


def test_without_a_token_a_forwarded_request_is_refused(client, db) -> None:  # type: ignore[no-untyped-def]
    # A proxy on the same host connects from loopback; the header says who really asked.
    response = client.get("/metrics", HTTP_X_FORWARDED_FOR="203.0.113.9")

    assert response.status_code == 403


def test_with_a_token_it_wants_the_bearer_token(client, db, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_METRICS_TOKEN = "s3cret-metrics"

    missing = client.get("/metrics")
    wrong = client.get("/metrics", HTTP_AUTHORIZATION="Bearer nope")
    right = client.get(
        "/metrics", HTTP_AUTHORIZATION="Bearer s3cret-metrics", REMOTE_ADDR="10.1.2.3"
    )

    assert missing.status_code == 401
    assert missing["WWW-Authenticate"] == 'Bearer realm="metrics"'
    assert "bearer token" in missing.json()["error"]
    assert wrong.status_code == 401
    assert right.status_code == 200


@pytest.mark.parametrize(
    "header",
    ["Bearer s3cret-métrics", "Bearer \u00e9\u00a9", "Bearer ünïcode", "Bearer \ud800", "Bearer ✓"],
)
def test_a_token_with_characters_outside_ascii_is_refused_as_wrong(  # type: ignore[no-untyped-def]
    client, db, settings, header
) -> None:
    settings.TASKDESK_METRICS_TOKEN = "s3cret-metrics"

    response = client.get("/metrics", HTTP_AUTHORIZATION=header)

    assert response.status_code == 401
    assert response["WWW-Authenticate"] == 'Bearer realm="metrics"'


def test_only_get_is_answered(client, db) -> None:  # type: ignore[no-untyped-def]
    assert client.post("/metrics").status_code == 405


# --- gauges from the database --------------------------------------------------------------


def make_task(client_, status: str = Status.WORKING, **fields) -> Task:  # type: ignore[no-untyped-def]
    return Task.objects.create(
        client=client_, tool_name="slow_echo", arguments={}, status=status, **fields
    )


@pytest.mark.postgres
def test_past_the_exact_limit_a_status_is_estimated_by_the_planner(  # type: ignore[no-untyped-def]
    client, alice, monkeypatch
) -> None:
    from django.db import connection

    from tasks_app import metrics

    monkeypatch.setattr(metrics, "TASKS_EXACT_UP_TO", 50)
    Task.objects.bulk_create(
        Task(client=alice, tool_name="slow_echo", arguments={}, status=Status.COMPLETED)
        for _ in range(400)
    )
    make_task(alice)  # one working: counted exactly
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE tasks_app_task")

    found = scrape(client)

    assert 300 <= value(found, "taskdesk_tasks", status="completed") <= 500  # an estimate
    assert value(found, "taskdesk_tasks", status="working") == 1


def analyze(table: str) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {table}")


def completed_tasks(client_, n: int) -> None:  # type: ignore[no-untyped-def]
    Task.objects.bulk_create(
        Task(client=client_, tool_name="slow_echo", arguments={}, status=Status.COMPLETED)
        for _ in range(n)
    )


@pytest.mark.postgres
def test_the_statuses_are_estimated_from_the_statistics_and_the_small_ones_counted(  # type: ignore[no-untyped-def]
    client, alice, monkeypatch
) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from tasks_app import metrics

    monkeypatch.setattr(metrics, "TASKS_EXACT_UP_TO", 50)
    completed_tasks(alice, 2000)
    for _ in range(30):
        make_task(alice, Status.FAILED)
    for _ in range(3):
        make_task(alice)
    analyze("tasks_app_task")

    with CaptureQueriesContext(connection) as queries:
        found = scrape(client)

    assert 1900 <= value(found, "taskdesk_tasks", status="completed") <= 2100
    assert value(found, "taskdesk_tasks_estimated", status="completed") == 1
    # Under the limit by the statistics: counted, and shown as counted.
    for status, n in (("failed", 30), ("working", 3), ("input_required", 0)):
        assert value(found, "taskdesk_tasks", status=status) == n, status
        assert value(found, "taskdesk_tasks_estimated", status=status) == 0, status
    # One read of the statistics for every status, no EXPLAIN of each.
    sql = [q["sql"] for q in queries.captured_queries]
    assert not [q for q in sql if q.startswith("EXPLAIN") and "tasks_app_task" in q]
    assert sum("pg_stats" in q for q in sql) == 2  # the tasks' and the effects'


@pytest.mark.postgres
def test_an_estimate_follows_the_growth_of_the_table_since_its_last_analyze(  # type: ignore[no-untyped-def]
    client, alice, monkeypatch
) -> None:
    from tasks_app import metrics
    from tasks_app.db.counting import planner_estimate

    monkeypatch.setattr(metrics, "TASKS_EXACT_UP_TO", 50)
    completed_tasks(alice, 1000)
    analyze("tasks_app_task")
    completed_tasks(alice, 1000)  # more pages: the planner scales the last count by them

    found = scrape(client)

    # Not 2,000 exactly: the pages also hold the rows of other tests, rolled back, that no
    # VACUUM has cleared yet, and the planner spreads the 1,000 analyzed rows over them all.
    completed = value(found, "taskdesk_tasks", status="completed")
    assert completed > 1000  # more than ANALYZE counted: the estimate followed the new pages
    assert abs(completed - planner_estimate(Task.objects.filter(status="completed"))) <= 1
    assert value(found, "taskdesk_tasks_estimated", status="completed") == 1


@pytest.mark.postgres
def test_a_status_the_statistics_put_under_the_limit_but_past_it_is_not_shown_as_exact(  # type: ignore[no-untyped-def]
    client, alice, monkeypatch
) -> None:
    from tasks_app import metrics

    monkeypatch.setattr(metrics, "TASKS_EXACT_UP_TO", 50)
    completed_tasks(alice, 500)
    analyze("tasks_app_task")  # no task working yet
    for _ in range(60):
        make_task(alice)

    found = scrape(client)

    assert value(found, "taskdesk_tasks", status="working") > 50  # past what was counted
    assert value(found, "taskdesk_tasks_estimated", status="working") == 1


def test_tasks_are_counted_by_status(client, alice) -> None:  # type: ignore[no-untyped-def]
    for _ in range(3):
        make_task(alice, Status.COMPLETED)
    make_task(alice, Status.FAILED)
    make_task(alice)

    found = scrape(client)

    assert value(found, "taskdesk_tasks", status="completed") == 3
    assert value(found, "taskdesk_tasks", status="failed") == 1
    assert value(found, "taskdesk_tasks", status="working") == 1
    # Every status is present, even at zero.
    assert ("taskdesk_tasks", (("status", "input_required"),)) in found
    assert value(found, "taskdesk_tasks", status="cancelled") == 0
    # A few tasks: every status counted, none an estimate.
    for status in Status.values:
        assert found[("taskdesk_tasks_estimated", (("status", status),))] == 0


def test_the_dispatch_backlog_and_its_oldest_age(client, alice) -> None:  # type: ignore[no-untyped-def]
    task = make_task(alice)
    old = Dispatch.objects.create(task=task, reason="accepted")
    Dispatch.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(minutes=5))
    Dispatch.objects.create(task=task, reason="answered")
    Dispatch.objects.create(
        task=task, reason="accepted", published_at=timezone.now(), consumed_at=timezone.now()
    )

    found = scrape(client)

    assert value(found, "taskdesk_dispatch_unpublished") == 2
    assert 299 <= value(found, "taskdesk_dispatch_oldest_unpublished_age_seconds") < 400
    assert value(found, "taskdesk_dispatch_waiting") == 2
    assert value(found, "taskdesk_dispatch_oldest_waiting_age_seconds") >= 299


def test_an_empty_backlog_is_zero(client, db) -> None:  # type: ignore[no-untyped-def]
    found = scrape(client)

    assert value(found, "taskdesk_dispatch_unpublished") == 0
    assert ("taskdesk_dispatch_oldest_unpublished_age_seconds", ()) in found
    assert value(found, "taskdesk_dispatch_oldest_unpublished_age_seconds") == 0


def test_effects_by_state(client, alice) -> None:  # type: ignore[no-untyped-def]
    task = make_task(alice)
    Effect.objects.create(task=task, seq=1, name="send", downstream_key="k1", state="unknown")
    Effect.objects.create(task=task, seq=2, name="send", downstream_key="k2", state="confirmed")
    Effect.objects.create(task=task, seq=3, name="send", downstream_key="k3", state="confirmed")

    found = scrape(client)

    assert value(found, "taskdesk_effects", state="unknown") == 1
    assert value(found, "taskdesk_effects", state="confirmed") == 2
    assert value(found, "taskdesk_effects", state="intended") == 0
    for state in ("intended", "confirmed", "failed", "unknown", "compensated"):
        assert found[("taskdesk_effects_estimated", (("state", state),))] == 0


@pytest.mark.postgres
def test_past_the_exact_limit_settled_effects_are_estimated_and_open_ones_counted(  # type: ignore[no-untyped-def]
    client, alice, monkeypatch
) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from tasks_app import metrics

    monkeypatch.setattr(metrics, "TASKS_EXACT_UP_TO", 50)
    task = make_task(alice)
    Effect.objects.bulk_create(
        Effect(task=task, seq=i, name="send", downstream_key=f"k{i}", state="confirmed")
        for i in range(400)
    )
    Effect.objects.create(task=task, seq=400, name="send", downstream_key="u", state="unknown")
    for i in (401, 402):
        Effect.objects.create(
            task=task, seq=i, name="send", downstream_key=f"i{i}", state="intended"
        )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE tasks_app_effect")

    with CaptureQueriesContext(connection) as queries:
        found = scrape(client)

    assert 380 <= value(found, "taskdesk_effects", state="confirmed") <= 420  # an estimate
    assert value(found, "taskdesk_effects_estimated", state="confirmed") == 1
    assert value(found, "taskdesk_effects", state="unknown") == 1
    assert value(found, "taskdesk_effects", state="intended") == 2
    assert value(found, "taskdesk_effects_estimated", state="unknown") == 0
    assert value(found, "taskdesk_effects_estimated", state="intended") == 0
    # No failed effect: the statistics cannot tell it from the one unknown effect (a value
    # seen once is not among the common ones), so "at most one", and said to be an estimate.
    assert value(found, "taskdesk_effects", state="failed") <= 1
    assert value(found, "taskdesk_effects_estimated", state="failed") == 1
    sql = [q["sql"] for q in queries.captured_queries]
    assert not [q for q in sql if q.startswith("EXPLAIN") and "tasks_app_effect" in q]


def test_the_database_gauges_are_read_once_an_interval_for_every_replica(  # type: ignore[no-untyped-def]
    client, alice, settings
) -> None:
    from django.core.cache import cache
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from tasks_app import metrics

    settings.TASKDESK_METRICS_DATABASE_SECONDS = 30
    make_task(alice)
    first = scrape(client)
    make_task(alice)
    # Another replica (another test client; the cache is shared) within the interval: the
    # same text, and no query of the tasks for it (the cache may be the database's).
    from django.test import Client

    with CaptureQueriesContext(connection) as queries:
        again = scrape(Client())
    assert not [q["sql"] for q in queries.captured_queries if "tasks_app_" in q["sql"]]
    assert value(first, "taskdesk_tasks", status="working") == 1
    assert value(again, "taskdesk_tasks", status="working") == 1
    # The process's own counters are not kept: only the database's gauges are.
    assert ("taskdesk_database_up", ()) in again
    cache.delete(metrics.DATABASE_GAUGES_KEY)  # the interval is over
    assert value(scrape(client), "taskdesk_tasks", status="working") == 2


HEARTBEAT = "taskdesk_worker_heartbeat_age_seconds"


def heartbeat_roles(found: dict) -> set[str]:  # type: ignore[type-arg]
    return {dict(labels)["role"] for name, labels in found if name == HEARTBEAT}


def test_each_heartbeat_role_is_absent_until_it_reports(client, db) -> None:  # type: ignore[no-untyped-def]
    assert heartbeat_roles(scrape(client)) == set()

    # The control workers' own rows, on two hosts.
    now = timezone.now()
    WorkerHeartbeat.objects.create(
        hostname="control@h1", seen_at=now - timedelta(seconds=90), queues="control"
    )
    WorkerHeartbeat.objects.create(
        hostname="control@h2", seen_at=now - timedelta(seconds=30), queues="control"
    )
    found = scrape(client)
    assert heartbeat_roles(found) == {"control"}
    assert 29 <= value(found, HEARTBEAT, role="control") < 60  # the newest row counts

    WorkerHeartbeat.objects.create(
        hostname="worker@h1", seen_at=now - timedelta(seconds=5), queues="celery"
    )
    found = scrape(client)
    assert heartbeat_roles(found) == {"legs", "control"}
    assert 4 <= value(found, HEARTBEAT, role="legs") < 30

    heartbeat_job()  # beat sent it, a control worker ran it
    found = scrape(client)
    assert heartbeat_roles(found) == {"legs", "control", "beat"}
    assert value(found, HEARTBEAT, role="beat") < 5


def test_dead_leg_workers_show_while_beat_and_the_control_worker_run(client, db) -> None:  # type: ignore[no-untyped-def]
    now = timezone.now()
    WorkerHeartbeat.objects.create(
        hostname="worker1@h1", seen_at=now - timedelta(minutes=10), queues="celery"
    )
    WorkerHeartbeat.objects.create(
        hostname="worker2@h2", seen_at=now - timedelta(minutes=20), queues="celery"
    )
    # The control worker's own row and heartbeat_job's row are fresh.
    WorkerHeartbeat.objects.create(hostname="control@h1", seen_at=now, queues="control")
    WorkerHeartbeat.objects.create(
        hostname="h1", seen_at=now - timedelta(seconds=3), queues=WorkerHeartbeat.BEAT
    )

    found = scrape(client)

    assert value(found, HEARTBEAT, role="control") < 5
    assert 3 <= value(found, HEARTBEAT, role="beat") < 10
    assert 599 <= value(found, HEARTBEAT, role="legs") < 660  # the freshest leg worker
    # A worker that consumes both queues takes legs: it counts as one.
    WorkerHeartbeat.objects.create(hostname="all@h3", seen_at=now, queues="celery,control")
    assert value(scrape(client), HEARTBEAT, role="legs") < 5


def test_a_dead_beat_shows_while_the_control_worker_runs(client, db) -> None:  # type: ignore[no-untyped-def]
    now = timezone.now()
    WorkerHeartbeat.objects.create(hostname="worker@h1", seen_at=now, queues="celery")
    WorkerHeartbeat.objects.create(hostname="control@h1", seen_at=now, queues="control")
    # heartbeat_job's last row, from before beat died.
    WorkerHeartbeat.objects.create(
        hostname="h1", seen_at=now - timedelta(minutes=10), queues=WorkerHeartbeat.BEAT
    )

    found = scrape(client)

    assert value(found, HEARTBEAT, role="control") < 5
    assert value(found, HEARTBEAT, role="legs") < 5
    assert 599 <= value(found, HEARTBEAT, role="beat") < 660


def test_pending_questions_by_audience_with_the_overdue_ones(client, alice) -> None:  # type: ignore[no-untyped-def]
    from elicitations import transitions

    task = make_task(alice)

    def ask(key: str, audience: str, deadline=None):  # type: ignore[no-untyped-def]
        return transitions.open_request(
            task=task,
            ask_key=key,
            message=f"{key}?",
            schema={"type": "object", "properties": {"ok": {"type": "boolean"}}},
            audience=audience,
            deadline=deadline,
        )

    ask("a", "operator")
    ask("b", "operator", deadline=timezone.now() - timedelta(minutes=2))
    ask("c", "client", deadline=timezone.now() + timedelta(hours=1))

    found = scrape(client)

    assert value(found, "taskdesk_input_requests_pending", audience="operator") == 2
    assert value(found, "taskdesk_input_requests_pending", audience="client") == 1
    assert value(found, "taskdesk_input_requests_pending", audience="any") == 0
    assert value(found, "taskdesk_input_requests_overdue", audience="operator") == 1
    assert value(found, "taskdesk_input_requests_overdue", audience="client") == 0
    past = value(found, "taskdesk_input_requests_most_overdue_seconds", audience="operator")
    assert 119 <= past < 200
    assert (
        value(found, "taskdesk_input_requests_oldest_pending_age_seconds", audience="client") >= 0
    )


# --- counters of processes -------------------------------------------------------------------


def test_a_receipt_counts_as_new_and_a_retry_as_replayed(client, alice) -> None:  # type: ignore[no-untyped-def]
    tool = get_tool("slow_echo")
    assert tool is not None
    labels = {"tool": "slow_echo"}
    before = scrape(client)

    key = acceptance.IdempotencyKey(value="metrics-key-1", carrier="header")
    for _ in range(3):
        acceptance.accept(client=alice, tool=tool, arguments={"text": "hi"}, era="2026-07-28",
                          key=key)  # fmt: skip

    after = scrape(client)
    name = "taskdesk_tasks_accepted_total"
    assert (
        value(after, name, replayed="false", **labels)
        - value(before, name, replayed="false", **labels)
        == 1
    )
    assert (
        value(after, name, replayed="true", **labels)
        - value(before, name, replayed="true", **labels)
        == 2
    )


def test_a_task_that_ends_is_timed_by_tool_and_status(
    client, alice, django_capture_on_commit_callbacks
) -> None:  # type: ignore[no-untyped-def]
    from tasks_app import transitions

    task = make_task(alice)
    Task.objects.filter(pk=task.pk).update(created_at=timezone.now() - timedelta(seconds=3))
    name = "taskdesk_task_duration_seconds"
    labels = {"tool": "slow_echo", "status": "failed"}
    before = scrape(client)

    with django_capture_on_commit_callbacks(execute=True):  # counted once committed
        transitions.fail(task_id=task.pk, error={"code": -32603, "message": "gave up"})

    after = scrape(client)
    count = value(after, f"{name}_count", **labels) - value(before, f"{name}_count", **labels)
    total = value(after, f"{name}_sum", **labels) - value(before, f"{name}_sum", **labels)
    assert count == 1
    assert 3 <= total < 30

    # Three seconds fall in the 5 s bucket, not the 2.5 s one.
    def added(bucket: str) -> float:
        le = {"le": bucket, **labels}
        return value(after, f"{name}_bucket", **le) - value(before, f"{name}_bucket", **le)

    assert (added("2.5"), added("5.0")) == (0, 1)


@pytest.mark.django_db(transaction=True)
def test_mcp_requests_are_counted_by_method_and_code(client, alice_token) -> None:  # type: ignore[no-untyped-def]
    from tests.wire import headers_for, request

    before = scrape(client)
    for message in (request("tools/list"), request("no/such/method")):
        client.post(
            "/mcp",
            data=message,
            content_type="application/json",
            headers={**headers_for(message), "Authorization": f"Bearer {alice_token}"},
        )

    after = scrape(client)
    name = "taskdesk_mcp_requests_total"
    assert (
        value(after, name, method="tools/list", code="ok")
        - value(before, name, method="tools/list", code="ok")
        == 1
    )
    # An unknown method is counted as "other", whatever it was called.
    assert (
        value(after, name, method="other", code="-32601")
        - value(before, name, method="other", code="-32601")
        == 1
    )
    hist = "taskdesk_mcp_request_duration_seconds_count"
    assert value(after, hist, method="tools/list") - value(before, hist, method="tools/list") == 1


def test_clear_metrics_empties_the_folder(settings, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from io import StringIO

    from django.core.management import call_command

    folder = tmp_path / "prometheus"
    folder.mkdir()
    (folder / "counter_4242.db").write_bytes(b"old run")
    settings.PROMETHEUS_MULTIPROC_DIR = folder
    out = StringIO()

    call_command("clear_metrics", stdout=out)

    assert folder.is_dir()
    assert list(folder.iterdir()) == []
    assert out.getvalue().strip() == f"emptied {folder}"
