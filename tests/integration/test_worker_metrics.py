"""A worker node's own /metrics (TASKDESK_WORKER_METRICS_PORT): a scrape of the port shows the
legs its pool ran, with the web's token rule."""

from __future__ import annotations

import httpx
import pytest

from tests.integration.worker_helpers import submit, terminal
from tests.live import free_port, live_stack
from tests.runtime_toolset import RUNTIME_TOOLSETS

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]


def test_a_scrape_of_the_workers_port_shows_its_legs(alice, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_TOOLSETS = RUNTIME_TOOLSETS
    port = free_port()
    env = {
        "TASKDESK_TOOLSETS": ",".join(RUNTIME_TOOLSETS),
        "TASKDESK_WORKER_METRICS_PORT": str(port),
        "TASKDESK_METRICS_TOKEN": "worker-scrape-token-123",
    }
    with live_stack(env=env, beat=False):  # one worker process: the port is its own
        task = terminal(submit(alice, "noop"))
        url = f"http://127.0.0.1:{port}/metrics"
        scraped = httpx.get(url, headers={"Authorization": "Bearer worker-scrape-token-123"})
        refused = httpx.get(url)

    assert task.status == "completed"
    assert scraped.status_code == 200
    assert 'taskdesk_leg_duration_seconds_count{tool="noop"}' in scraped.text
    assert refused.status_code == 401
