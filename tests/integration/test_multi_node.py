"""Several nodes on one database and broker: two web processes on two ports, three workers
with distinct node names and one beat, on PostgreSQL, with Redis and with RabbitMQ.

1,000 keyed calls go round-robin to the two webs. Midway one worker is killed with kill -9
(its main process and pool together) and one web is stopped; clients retry a call that
failed to connect on the other web, with the same key, as a client behind a proxy would.
Every key must end as exactly one completed task, and /metrics on the surviving web must
show the totals of both webs (they share the host's metrics folder).
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from celery import Celery
from django.conf import settings
from prometheus_client.parser import text_string_to_metric_families

from tasks_app.models import Status, Task
from tests import services
from tests.live import MONITOR_HEADERS, LiveStack, RedisServer, free_port, wait_for
from tests.wire import REPLAYED_META, result_of, tools_call

pytestmark = [pytest.mark.live, pytest.mark.slow, pytest.mark.postgres]

CALLS = 1000
CLIENT_THREADS = 8
RESENT_EVERY = 50  # every 50th call is sent again after its answer: a lost acknowledgement
KILL_WORKER_AT = 300
STOP_WEB_AT = 600


@pytest.fixture(
    params=[
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("rabbitmq", marks=pytest.mark.rabbitmq),
    ]
)
def broker_url(request):  # type: ignore[no-untyped-def]
    if request.param == "redis":
        server = RedisServer(free_port())  # a Redis of its own: nothing else consumes here
        server.start()
        yield server.url
        server.stop()
        return
    url = services.amqp_url()
    assert url is not None  # the rabbitmq marker skips (or fails) the test without one
    # Messages left in the vhost by an earlier run name tasks that are gone.
    Celery(broker=url, set_as_current=False).control.purge()
    yield url


class Clients:
    """CLIENT_THREADS callers sharing the calls; each call retries, with the same key, on the
    other web when its web cannot be reached."""

    def __init__(self, urls: list[str], token: str, run: str) -> None:
        self.urls, self.token, self.run = urls, token, run
        self.done = 0
        self.connection_retries = 0
        self.replays_seen = 0
        self.lock = threading.Lock()

    def key(self, i: int) -> str:
        return f"multi-{self.run}-{i:04d}"

    def call(self, i: int, first: int) -> dict[str, Any]:
        body, headers = tools_call(
            "slow_echo", {"text": self.key(i), "seconds": 0}, key=self.key(i), token=self.token
        )
        for attempt in range(40):
            url = self.urls[(first + attempt) % len(self.urls)]
            try:
                response = httpx.post(url, content=body, headers=headers, timeout=60)
            except httpx.TransportError:
                with self.lock:
                    self.connection_retries += 1
                time.sleep(0.05)
                continue
            result = result_of(response)
            if result["_meta"][REPLAYED_META]:
                with self.lock:
                    self.replays_seen += 1
            return result
        raise AssertionError(f"call {i} reached no web in 40 attempts")

    def submit(self, i: int) -> str:
        task_id: str = self.call(i, first=i % 2)["taskId"]
        if i % RESENT_EVERY == 0:
            again = self.call(i, first=(i + 1) % 2)  # the retry goes to the other web
            assert again["taskId"] == task_id, (i, again, task_id)
        with self.lock:
            self.done += 1
        return task_id


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = httpx.get(f"{url}/metrics", headers=MONITOR_HEADERS, timeout=30)
    assert response.status_code == 200, response.text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def test_keyed_calls_survive_a_killed_worker_and_a_stopped_web(  # type: ignore[no-untyped-def]
    transactional_db, broker_url, alice, alice_token
) -> None:
    stack = LiveStack(
        env={
            "CELERY_BROKER_URL": broker_url,
            # The keyed calls wait for their results (held work): CLIENT_THREADS of them at
            # once from one client, over two web processes, each with its two
            # TASKDESK_RESERVED_THREADS for quick requests beside them.
            "WEB_THREADS": str(CLIENT_THREADS // 2 + 2),
            "TASKDESK_SYNC_CONCURRENCY": str(CLIENT_THREADS // 2),
            "TASKDESK_SYNC_PER_CLIENT": str(CLIENT_THREADS),
            # The shared cache this test process made (its Redis, or the database cache whose
            # table the test database has): an AMQP broker alone would mean a database cache
            # whose table this test database, made for the Redis settings, does not have.
            "TASKDESK_CACHE_URL": settings.TASKDESK_CACHE_URL,
            # A message the killed worker had taken but not acknowledged: published again
            # soon (its record stays unconsumed), not after the default two minutes.
            "TASKDESK_DISPATCH_REPUBLISH_SECONDS": "5",
        },
        web_workers=2,
        worker=False,
        beat=False,
    )
    second_port = free_port()
    try:
        stack.collect_static()
        stack.clear_metrics()
        stack.start_web("web")
        stack.start_web("web2", port=second_port)
        for name in ("w1", "w2", "w3"):
            stack.start_worker(2, name=name)
        stack.start_control()  # the sweeper, heartbeat and deadlines, with beat
        stack.wait_healthy()
        second = f"http://127.0.0.1:{second_port}"
        wait_for("the second web", lambda: _healthy(second), 60, every=0.2)

        clients = Clients([stack.mcp_url, f"{second}/mcp"], alice_token, uuid.uuid4().hex[:8])
        started = time.monotonic()
        with ThreadPoolExecutor(CLIENT_THREADS) as pool:
            futures = [pool.submit(clients.submit, i) for i in range(CALLS)]
            wait_for("calls to reach the kill", lambda: clients.done >= KILL_WORKER_AT, 180)
            worker = stack.procs.pop("w2")
            os.killpg(worker.pid, signal.SIGKILL)  # the worker's main process and its pool
            worker.wait(10)
            wait_for("calls to reach the stop", lambda: clients.done >= STOP_WEB_AT, 180)
            stack.stop("web2")
            task_ids = [future.result() for future in futures]
        submitted = time.monotonic()

        wait_for(
            f"{CALLS} completed tasks",
            lambda: Task.objects.filter(status=Status.COMPLETED).count() >= CALLS,
            240,
            every=0.5,
            explain=lambda: str(Counter(Task.objects.values_list("status", flat=True))),
        )

        print(
            f"{CALLS} calls answered in {submitted - started:.1f} s, all completed "
            f"{time.monotonic() - submitted:.1f} s later; {clients.connection_retries} "
            f"connection retries, {clients.replays_seen} replayed receipts"
        )
        # Every key is exactly one task, completed, with the answer its call got.
        tasks = {t.idempotency_key: t for t in Task.objects.filter(client=alice)}
        assert len(tasks) == Task.objects.count() == CALLS
        assert set(tasks) == {clients.key(i) for i in range(CALLS)}
        for i, task_id in enumerate(task_ids):
            task = tasks[clients.key(i)]
            assert task.pk == task_id
            assert task.status == Status.COMPLETED
            assert task.result is not None
            assert task.result["content"][0]["text"] == clients.key(i)
        assert clients.connection_retries > 0  # calls sent to the stopped web went elsewhere

        # The surviving web shows the totals, the stopped web's counts included.
        found = scrape(stack.url)
        accepted = "taskdesk_tasks_accepted_total"
        labels = (("replayed", "false"), ("tool", "slow_echo"))
        assert found[(accepted, labels)] == CALLS
        replayed = found.get((accepted, (("replayed", "true"), ("tool", "slow_echo"))), 0)
        assert replayed >= clients.replays_seen >= CALLS // RESENT_EVERY
        assert found[("taskdesk_tasks", (("status", "completed"),))] == CALLS
        assert found[("taskdesk_dispatch_unpublished", ())] == 0

        # Three workers, each under its own node name.
        for name in ("w1", "w2", "w3"):
            assert f"{name}-{stack.port}@" in stack.log(name), stack.log(name)[-2000:]
    finally:
        stack.close()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
