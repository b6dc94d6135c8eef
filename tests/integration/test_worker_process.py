from __future__ import annotations

import httpx
import pytest

from tasks_app.models import WorkerHeartbeat

# broker: CI runs these on RabbitMQ as well as Redis.
pytestmark = pytest.mark.broker


@pytest.mark.live
def test_a_real_worker_process_consumes_a_job_from_the_broker(live) -> None:  # type: ignore[no-untyped-def]
    from config.celery import app

    WorkerHeartbeat.objects.filter(queues="control").delete()
    app.send_task("heartbeat_job")
    for _ in range(100):
        if WorkerHeartbeat.objects.filter(queues="control").exists():
            break
        import time

        time.sleep(0.1)
    assert WorkerHeartbeat.objects.filter(queues="control").count() == 1
    body = httpx.get(f"{live.url}/healthz").json()
    assert body["workers"]["ok"] is True
    assert body["workers"]["control"]["heartbeat"] is not None
    assert body["workers"]["legs"]["heartbeat"] is not None  # the leg worker's own row
