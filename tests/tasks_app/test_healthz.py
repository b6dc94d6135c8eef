from __future__ import annotations

import re
import socket
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from tasks_app.models import WorkerHeartbeat
from tasks_app.tasks import _beat, heartbeat_job
from tests.live import METRICS_TOKEN, LiveStack

STALE = timedelta(minutes=10)
# What monitoring sends: the parts, heartbeats and warnings are not for anonymous callers.
MONITOR = {"Authorization": f"Bearer {METRICS_TOKEN}"}


@pytest.fixture(autouse=True)
def _metrics_token(settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_METRICS_TOKEN = METRICS_TOKEN


def leg_worker(ago: timedelta = timedelta(0)) -> None:
    """A leg worker's own row, as its heartbeat thread writes it."""
    _beat("worker@w1", "celery")
    WorkerHeartbeat.objects.filter(hostname="worker@w1").update(seen_at=timezone.now() - ago)


def control_worker(ago: timedelta = timedelta(0)) -> None:
    """The control worker's own row, as its heartbeat thread writes it."""
    _beat("control@w1", "control")
    WorkerHeartbeat.objects.filter(hostname="control@w1").update(seen_at=timezone.now() - ago)


def beat(ago: timedelta = timedelta(0)) -> None:
    """heartbeat_job's row: beat sent it, a control worker ran it."""
    hostname = heartbeat_job()
    WorkerHeartbeat.objects.filter(hostname=hostname).update(seen_at=timezone.now() - ago)


def test_it_answers_200_with_each_part_named(client, db) -> None:  # type: ignore[no-untyped-def]
    response = client.get("/healthz", headers=MONITOR)

    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert body["database"]["ok"] is True
    assert body["broker"]["ok"] is True
    assert body["workers"] == {
        "ok": True,
        "heartbeat": None,
        "legs": {"ok": True, "heartbeat": None},
        "control": {"ok": True, "heartbeat": None},
        "beat": {"ok": True, "heartbeat": None},
    }
    assert response["Cache-Control"].startswith("max-age=0")


def test_it_is_exactly_that_path(client, db) -> None:  # type: ignore[no-untyped-def]
    assert client.get("/healthz/").status_code == 404


def test_a_stale_worker_heartbeat_makes_it_503(admin_client, db) -> None:  # type: ignore[no-untyped-def]
    control_worker(STALE)

    response = admin_client.get("/healthz")

    assert response.status_code == 503
    assert response.json()["failing"] == ["workers"]
    error = response.json()["workers"]["error"]
    assert re.match(r"the control worker: last heartbeat 60[01] s ago", error)


def test_a_stale_beat_heartbeat_makes_it_503_while_the_control_worker_runs(
    admin_client, db
) -> None:  # type: ignore[no-untyped-def]
    leg_worker()
    control_worker()
    beat(STALE)

    response = admin_client.get("/healthz")

    assert response.status_code == 503
    workers = response.json()["workers"]
    assert (workers["legs"]["ok"], workers["control"]["ok"], workers["beat"]["ok"]) == (
        True,
        True,
        False,
    )
    # 600 s, or a second more when the test machine is slow between the write and the read
    assert re.fullmatch(
        r"beat \(its heartbeat job, run by a control worker\): last heartbeat 60[01] s ago",
        workers["error"],
    )


def test_logged_in_operators_who_are_not_staff_get_no_error_text(client, operator) -> None:  # type: ignore[no-untyped-def]
    control_worker(STALE)
    client.force_login(operator)

    for path in ("/healthz", "/healthz?strict=1"):
        response = client.get(path)
        assert response.status_code == 503
        assert response.json()["workers"]["error"] == "unavailable"
        assert response.json()["database"]["vendor"] == connection.vendor


@pytest.mark.parametrize("path", ["/healthz", "/healthz?strict=1"])
def test_anonymous_callers_get_the_status_alone(client, db, settings, path) -> None:  # type: ignore[no-untyped-def]
    settings.SECRET_KEY_GENERATED = True
    leg_worker()
    control_worker()
    beat()

    healthy = client.get(path)
    control_worker(STALE)
    failing = client.get(path)
    wrong_token = client.get(path, headers={"Authorization": "Bearer nope"})

    assert (healthy.status_code, healthy.json()) == (200, {"status": "ok"})
    assert (failing.status_code, failing.json()) == (503, {"status": "fail"})
    assert (wrong_token.status_code, wrong_token.json()) == (503, {"status": "fail"})


@pytest.mark.parametrize("path", ["/healthz", "/healthz?strict=1"])
def test_the_metrics_token_and_staff_get_every_detail(
    client, admin_client, db, settings, path
) -> None:  # type: ignore[no-untyped-def]
    settings.SECRET_KEY_GENERATED = True
    control_worker(STALE)

    for response in (client.get(path, headers=MONITOR), admin_client.get(path)):
        assert response.status_code == 503
        body = response.json()
        assert body["failing"] == ["workers"]
        assert body["database"] == {"ok": True, "vendor": connection.vendor}
        assert body["broker"]["transport"]
        assert body["workers"]["control"]["heartbeat"] is not None
        # 600 s when written; a second or two more on a slow machine by the time it is read.
        assert re.search(r"the control worker: last heartbeat 60\d s ago", body["workers"]["error"])
        assert body["warnings"][0].startswith("SECRET_KEY was generated on this host")


# --- /livez and /healthz?strict=1 ------------------------------------------------------------------------


def test_livez_answers_200_whatever_the_parts_say(client, db) -> None:  # type: ignore[no-untyped-def]
    control_worker(STALE)

    response = client.get("/livez")

    assert (response.status_code, response.json()) == (200, {"status": "ok"})
    assert response["Cache-Control"].startswith("max-age=0")


def test_strict_health_fails_until_a_worker_has_reported(client, db) -> None:  # type: ignore[no-untyped-def]
    response = client.get("/healthz?strict=1", headers=MONITOR)

    assert response.status_code == 503
    assert response.json()["failing"] == ["workers"]
    assert client.get("/healthz").status_code == 200  # which stays as it was

    # beat and the control worker alone are not enough: no worker takes legs yet.
    control_worker()
    beat()
    response = client.get("/healthz?strict=1", headers=MONITOR)
    assert response.status_code == 503
    legs = response.json()["workers"]["legs"]
    assert (legs["ok"], legs["heartbeat"]) == (False, None)

    leg_worker()
    response = client.get("/healthz?strict=1", headers=MONITOR)
    assert response.status_code == 200
    assert response.json()["status"] == "ok"


def test_strict_health_fails_naming_beat_while_only_the_workers_report(admin_client, db) -> None:  # type: ignore[no-untyped-def]
    # Beat is down: the control worker's own row is fresh, but no heartbeat job ran.
    leg_worker()
    control_worker()

    response = admin_client.get("/healthz?strict=1")

    assert response.status_code == 503
    assert response.json()["failing"] == ["workers"]
    workers = response.json()["workers"]
    assert workers["control"]["ok"] is True
    assert (workers["beat"]["ok"], workers["beat"]["heartbeat"]) == (False, None)
    assert workers["error"] == "beat (its heartbeat job, run by a control worker): no heartbeat yet"
    assert admin_client.get("/healthz").status_code == 200  # a fresh install, for /healthz

    beat()  # beat is back and a control worker ran its heartbeat job
    response = admin_client.get("/healthz?strict=1")
    assert response.status_code == 200
    assert response.json()["workers"]["beat"]["age_seconds"] < 5


def test_the_heartbeat_job_writes_the_beat_heartbeat_and_no_other(db) -> None:  # type: ignore[no-untyped-def]
    control_worker(STALE)

    hostname = heartbeat_job()

    assert hostname == socket.gethostname()
    assert WorkerHeartbeat.objects.get(hostname=hostname).queues == WorkerHeartbeat.BEAT
    last = WorkerHeartbeat.newest_by_role()
    assert last[WorkerHeartbeat.BEAT] is not None
    assert (timezone.now() - last[WorkerHeartbeat.BEAT]).total_seconds() < 5
    assert last[WorkerHeartbeat.LEGS] is None
    assert (timezone.now() - last[WorkerHeartbeat.CONTROL]).total_seconds() >= 600


def test_strict_health_fails_on_a_stale_heartbeat_with_the_reason_for_staff(
    admin_client, db
) -> None:  # type: ignore[no-untyped-def]
    control_worker(STALE)
    beat(STALE)
    leg_worker(timedelta(minutes=5))

    response = admin_client.get("/healthz?strict=1")

    assert response.status_code == 503
    assert response.json()["workers"]["error"] == (
        "a worker taking legs: last heartbeat 300 s ago; "
        "the control worker: last heartbeat 600 s ago; "
        "beat (its heartbeat job, run by a control worker): last heartbeat 600 s ago"
    )


def test_a_fresh_heartbeat_is_reported(client, db) -> None:  # type: ignore[no-untyped-def]
    control_worker()
    beat()

    body = client.get("/healthz", headers=MONITOR).json()

    assert body["workers"]["ok"] is True
    assert body["workers"]["control"]["age_seconds"] < 5
    assert body["workers"]["beat"]["age_seconds"] < 5


@pytest.mark.live
def test_an_unreachable_broker_makes_it_503_naming_the_broker(transactional_db) -> None:  # type: ignore[no-untyped-def]
    # A server whose broker points at a closed port: the database is fine, the broker is not.
    stack = LiveStack(env={"CELERY_BROKER_URL": "redis://127.0.0.1:9/0"}, worker=False, beat=False)
    try:
        stack.start(wait=False)
        import time

        import httpx

        for _ in range(100):
            try:
                response = httpx.get(f"{stack.url}/healthz", headers=MONITOR, timeout=10)
                break
            except httpx.TransportError:
                time.sleep(0.2)
        assert response.status_code == 503
        body = response.json()
        assert body["failing"] == ["broker"]
        assert body["database"]["ok"] is True
        assert body["broker"]["transport"] == "redis"
    finally:
        stack.close()


@pytest.mark.live
def test_strict_health_turns_ok_once_beat_and_a_worker_run(live) -> None:  # type: ignore[no-untyped-def]
    import httpx

    from tests.live import wait_for

    ready = wait_for(
        "/healthz?strict=1 to answer 200",
        lambda: (
            (r := httpx.get(f"{live.url}/healthz?strict=1", headers=MONITOR, timeout=5)).status_code
            == 200
            and r
        ),
        timeout=60,
        every=0.5,
    )

    assert ready.json()["workers"]["ok"] is True
    assert httpx.get(f"{live.url}/livez", timeout=5).status_code == 200


def test_it_warns_when_the_secret_key_was_generated_on_this_host(client, db, settings) -> None:  # type: ignore[no-untyped-def]
    settings.SECRET_KEY_GENERATED = True

    response = client.get("/healthz", headers=MONITOR)

    assert response.status_code == 200  # a warning, not a failure
    (warning,) = response.json()["warnings"]
    assert warning.startswith("SECRET_KEY was generated on this host")
    assert "Set the same SECRET_KEY (or SECRET_KEY_FILE) for every process." in warning


def test_a_secret_key_from_the_environment_gives_no_warning(client, db, settings) -> None:  # type: ignore[no-untyped-def]
    settings.SECRET_KEY_GENERATED = False

    assert client.get("/healthz", headers=MONITOR).json()["warnings"] == []


@pytest.mark.live
def test_strict_health_fails_when_the_leg_worker_stops_while_beat_and_control_run(
    transactional_db,
) -> None:  # type: ignore[no-untyped-def]
    import httpx

    from tests.live import wait_for

    stack = LiveStack(
        env={"TASKDESK_HEARTBEAT_SECONDS": "1", "TASKDESK_WORKER_STALE_SECONDS": "3"}
    ).start()
    try:

        def strict() -> httpx.Response:
            return httpx.get(f"{stack.url}/healthz?strict=1", headers=MONITOR, timeout=5)

        wait_for("/healthz?strict=1 to answer 200", lambda: strict().status_code == 200, timeout=60)
        row = WorkerHeartbeat.objects.get(hostname=f"worker-{stack.port}@{socket.gethostname()}")
        assert row.queues == "celery"
        stack.stop("worker")
        stopped = wait_for(
            "/healthz?strict=1 to fail on the leg worker",
            lambda: (r := strict()).status_code == 503 and r,
            timeout=20,
        )
        workers = stopped.json()["workers"]
        assert workers["legs"]["ok"] is False
        assert workers["control"]["ok"] is True and workers["beat"]["ok"] is True
        stack.start_worker()
        wait_for(
            "/healthz?strict=1 to answer 200 again", lambda: strict().status_code == 200, timeout=60
        )
    finally:
        stack.close()


@pytest.mark.live
def test_strict_health_fails_and_readyz_stays_when_beat_stops_while_the_workers_run(
    transactional_db,
) -> None:  # type: ignore[no-untyped-def]
    import httpx

    from tests.live import wait_for

    # Beat as a process of its own (`taskdesk beat`, a control worker with --no-embed-beat).
    stack = LiveStack(
        env={"TASKDESK_HEARTBEAT_SECONDS": "1", "TASKDESK_WORKER_STALE_SECONDS": "3"}, beat=False
    ).start(wait=False)
    try:
        stack.start_control(embed_beat=False)
        stack.start_beat()
        stack.wait_healthy()

        def strict() -> httpx.Response:
            return httpx.get(f"{stack.url}/healthz?strict=1", headers=MONITOR, timeout=5)

        wait_for("/healthz?strict=1 to answer 200", lambda: strict().status_code == 200, timeout=60)
        control = WorkerHeartbeat.objects.get(
            hostname=f"control-{stack.port}@{socket.gethostname()}"
        )
        assert control.queues == "control"
        beat_row = WorkerHeartbeat.objects.get(hostname=socket.gethostname())
        assert beat_row.queues == WorkerHeartbeat.BEAT
        stack.stop("beat")
        stopped = wait_for(
            "/healthz?strict=1 to fail on beat",
            lambda: (r := strict()).status_code == 503 and r,
            timeout=20,
        )
        workers = stopped.json()["workers"]
        assert workers["beat"]["ok"] is False
        assert workers["legs"]["ok"] is True and workers["control"]["ok"] is True
        # A web process does not need beat: it stays in service.
        web = httpx.get(f"{stack.url}/readyz", headers=MONITOR, timeout=5)
        assert web.status_code == 200 and web.json()["failing"] == []
        stack.start_beat()
        wait_for(
            "/healthz?strict=1 to answer 200 again", lambda: strict().status_code == 200, timeout=60
        )
    finally:
        stack.close()
