"""A broker outage delays work and loses nothing.

The test runs its own Redis on a free port as the Celery broker of a live stack (web, worker,
beat), stops it, submits 100 tasks (every one gets its receipt, quickly), starts Redis again
on the same port (empty: it keeps nothing on disk), and then every task runs exactly once:
the sweeper publishes the dispatch records the web processes could not.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tasks_app.models import Dispatch, Status, Task, TaskEvent
from tests.live import RedisServer, free_port, live_stack
from tests.wire import REPLAYED_META, post, result_of, tools_call

# serial: it times each receipt while the broker is down (under a second), which three busy
# parallel workers beside it do not leave it (tests/parallel.py).
pytestmark = [pytest.mark.redis, pytest.mark.live, pytest.mark.serial]

SUBMISSIONS = 100


@pytest.fixture
def redis_broker() -> Iterator[RedisServer]:
    server = RedisServer(free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_tasks_submitted_while_the_broker_is_down_all_run_once_it_is_back(
    transactional_db, alice, alice_token, redis_broker
) -> None:
    with live_stack(env={"CELERY_BROKER_URL": redis_broker.url}) as stack:
        redis_broker.stop()

        slowest = 0.0
        task_ids = []
        for i in range(SUBMISSIONS):
            call = tools_call(
                "slow_echo",
                {"text": f"echo {i}", "seconds": 0.05},
                key=f"outage-{i}",
                token=alice_token,
            )
            started = time.monotonic()
            receipt = result_of(post(stack.mcp_url, call, timeout=10))
            slowest = max(slowest, time.monotonic() - started)
            assert receipt["resultType"] == "task"
            assert receipt["_meta"][REPLAYED_META] is False
            task_ids.append(receipt["taskId"])

        assert len(set(task_ids)) == SUBMISSIONS
        assert slowest < 1.0, f"a receipt took {slowest:.2f} s while the broker was down"
        assert Task.objects.count() == SUBMISSIONS
        assert Dispatch.objects.filter(published_at__isnull=False).count() == 0
        assert Task.objects.filter(status=Status.WORKING, leg=0).count() == SUBMISSIONS

        redis_broker.start()
        deadline = time.monotonic() + 120
        while Task.objects.filter(status=Status.COMPLETED).count() < SUBMISSIONS:
            assert time.monotonic() < deadline, (
                f"{Task.objects.filter(status=Status.COMPLETED).count()} of {SUBMISSIONS} "
                f"completed; worker log:\n{stack.log('worker')[-3000:]}"
            )
            time.sleep(0.5)

        # Each ran exactly once: one leg, one start, one completion, one consumed record.
        assert set(Task.objects.values_list("leg", flat=True)) == {1}
        for kind in ("leg_started", "completed"):
            per_task = TaskEvent.objects.filter(kind=kind).values_list("task_id", flat=True)
            assert sorted(per_task) == sorted(task_ids), kind
        assert Dispatch.objects.count() == SUBMISSIONS
        assert Dispatch.objects.filter(consumed_at__isnull=True).count() == 0
        results = {t.arguments["text"]: t.result for t in Task.objects.all()}
        assert results["echo 7"]["content"] == [{"type": "text", "text": "echo 7"}]
