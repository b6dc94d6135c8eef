from __future__ import annotations

import httpx
import pytest

from tasks_app.models import WorkerHeartbeat
from tests.live import MONITOR_HEADERS

# broker: CI runs these on RabbitMQ as well as Redis.
pytestmark = pytest.mark.broker


@pytest.mark.live
def test_a_real_worker_process_consumes_a_job_from_the_broker(live) -> None:  # type: ignore[no-untyped-def]
    from config.celery import app

    WorkerHeartbeat.objects.filter(queues=WorkerHeartbeat.BEAT).delete()
    app.send_task("heartbeat_job")
    for _ in range(100):
        last = WorkerHeartbeat.newest_by_role()
        if all(last[role] is not None for role in WorkerHeartbeat.ROLES):
            break
        import time

        time.sleep(0.1)
    assert WorkerHeartbeat.objects.filter(queues=WorkerHeartbeat.BEAT).count() == 1
    body = httpx.get(f"{live.url}/healthz", headers=MONITOR_HEADERS).json()
    assert body["workers"]["ok"] is True
    assert body["workers"]["beat"]["heartbeat"] is not None  # heartbeat_job's row
    assert body["workers"]["control"]["heartbeat"] is not None  # the control worker's own row
    assert body["workers"]["legs"]["heartbeat"] is not None  # the leg worker's own row
