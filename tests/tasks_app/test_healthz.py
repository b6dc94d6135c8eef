from __future__ import annotations

import socket
from datetime import timedelta

import pytest
from django.utils import timezone

from tasks_app.models import WorkerHeartbeat
from tests.live import LiveStack


def test_it_answers_200_with_each_part_named(client, db) -> None:  # type: ignore[no-untyped-def]
    response = client.get("/healthz")

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
    }
    assert response["Cache-Control"].startswith("max-age=0")


def test_it_is_exactly_that_path(client, db) -> None:  # type: ignore[no-untyped-def]
    assert client.get("/healthz/").status_code == 404


def test_a_stale_worker_heartbeat_makes_it_503(admin_client, db) -> None:  # type: ignore[no-untyped-def]
    WorkerHeartbeat.objects.create(hostname="w1", seen_at=timezone.now() - timedelta(minutes=10))

    response = admin_client.get("/healthz")

    assert response.status_code == 503
    assert response.json()["failing"] == ["workers"]
    error = response.json()["workers"]["error"]
    assert error.startswith("beat and the control worker: last heartbeat 600 s ago")


def test_anonymous_callers_get_no_error_text(client, db) -> None:  # type: ignore[no-untyped-def]
    WorkerHeartbeat.objects.create(hostname="w1", seen_at=timezone.now() - timedelta(minutes=10))

    for path in ("/healthz", "/readyz"):
        response = client.get(path)
        assert response.status_code == 503
        assert response.json()["workers"]["error"] == "unavailable"


# --- /livez and /readyz ------------------------------------------------------------------------


def test_livez_answers_200_whatever_the_parts_say(client, db) -> None:  # type: ignore[no-untyped-def]
    WorkerHeartbeat.objects.create(hostname="w1", seen_at=timezone.now() - timedelta(minutes=10))

    response = client.get("/livez")

    assert (response.status_code, response.json()) == (200, {"status": "ok"})
    assert response["Cache-Control"].startswith("max-age=0")


def test_readyz_fails_until_a_worker_has_reported(client, db) -> None:  # type: ignore[no-untyped-def]
    response = client.get("/readyz")

    assert response.status_code == 503
    assert response.json()["failing"] == ["workers"]
    assert client.get("/healthz").status_code == 200  # which stays as it was

    # beat and the control worker alone are not enough: no worker takes legs yet.
    WorkerHeartbeat.objects.create(hostname="w1", seen_at=timezone.now())
    response = client.get("/readyz")
    assert response.status_code == 503
    legs = response.json()["workers"]["legs"]
    assert (legs["ok"], legs["heartbeat"]) == (False, None)

    WorkerHeartbeat.objects.create(hostname="worker@w1", seen_at=timezone.now(), queues="celery")
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json()["status"] == "ok"


def test_readyz_fails_on_a_stale_heartbeat_with_the_reason_for_staff(admin_client, db) -> None:  # type: ignore[no-untyped-def]
    WorkerHeartbeat.objects.create(hostname="w1", seen_at=timezone.now() - timedelta(minutes=10))

    WorkerHeartbeat.objects.create(
        hostname="worker@w1", seen_at=timezone.now() - timedelta(minutes=5), queues="celery"
    )

    response = admin_client.get("/readyz")

    assert response.status_code == 503
    assert response.json()["workers"]["error"] == (
        "a worker taking legs: last heartbeat 300 s ago; "
        "beat and the control worker: last heartbeat 600 s ago"
    )


def test_a_fresh_heartbeat_is_reported(client, db) -> None:  # type: ignore[no-untyped-def]
    WorkerHeartbeat.objects.create(hostname="w1", seen_at=timezone.now())

    body = client.get("/healthz").json()

    assert body["workers"]["ok"] is True
    assert body["workers"]["control"]["age_seconds"] < 5


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
                response = httpx.get(f"{stack.url}/healthz", timeout=10)
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
def test_readyz_turns_ready_once_beat_and_a_worker_run(live) -> None:  # type: ignore[no-untyped-def]
    import httpx

    from tests.live import wait_for

    ready = wait_for(
        "/readyz to answer 200",
        lambda: (r := httpx.get(f"{live.url}/readyz", timeout=5)).status_code == 200 and r,
        timeout=60,
        every=0.5,
    )

    assert ready.json()["workers"]["ok"] is True
    assert httpx.get(f"{live.url}/livez", timeout=5).status_code == 200


def test_it_warns_when_the_secret_key_was_generated_on_this_host(client, db, settings) -> None:  # type: ignore[no-untyped-def]
    settings.SECRET_KEY_GENERATED = True

    response = client.get("/healthz")

    assert response.status_code == 200  # a warning, not a failure
    (warning,) = response.json()["warnings"]
    assert warning.startswith("SECRET_KEY was generated on this host")
    assert "Set the same SECRET_KEY (or SECRET_KEY_FILE) for every process." in warning


def test_a_secret_key_from_the_environment_gives_no_warning(client, db, settings) -> None:  # type: ignore[no-untyped-def]
    settings.SECRET_KEY_GENERATED = False

    assert client.get("/healthz").json()["warnings"] == []


@pytest.mark.live
def test_readyz_fails_when_the_leg_worker_stops_while_beat_and_control_run(
    transactional_db,
) -> None:  # type: ignore[no-untyped-def]
    import httpx

    from tests.live import wait_for

    stack = LiveStack(
        env={"TASKDESK_HEARTBEAT_SECONDS": "1", "TASKDESK_WORKER_STALE_SECONDS": "3"}
    ).start()
    try:

        def readyz() -> httpx.Response:
            return httpx.get(f"{stack.url}/readyz", timeout=5)

        wait_for("/readyz to answer 200", lambda: readyz().status_code == 200, timeout=60)
        row = WorkerHeartbeat.objects.get(hostname=f"worker-{stack.port}@{socket.gethostname()}")
        assert row.queues == "celery"
        stack.stop("worker")
        stopped = wait_for(
            "/readyz to fail on the leg worker",
            lambda: (r := readyz()).status_code == 503 and r,
            timeout=20,
        )
        workers = stopped.json()["workers"]
        assert workers["legs"]["ok"] is False and workers["control"]["ok"] is True
        stack.start_worker()
        wait_for("/readyz to answer 200 again", lambda: readyz().status_code == 200, timeout=60)
    finally:
        stack.close()
