"""Outages of the database and of the broker while clients keep submitting, against real
processes that are never restarted.

Each test has its own services, so that it can stop and start them: a PostgreSQL cluster of
its own (``PostgresCluster``: initdb in a temporary folder, its own port) and a redis-server
of its own. Fifty clients submit keyed ``refund_payment`` calls for 20 s and retry every call
that did not get a receipt (503, another error, or no connection) with the same key, as a
client should. Afterwards every key is exactly one task, every task has ended, and every
refund happened once.
"""

from __future__ import annotations

import collections
import json
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import psycopg
import pytest

from tasks_app.models import Effect, Status, Task
from tasks_app.tools.toolsets.demo.models import DemoRefund
from tests.live import (
    BIN,
    ROOT,
    LiveStack,
    RedisServer,
    free_port,
    live_stack,
    postgres_cluster,
    wait_for,
)
from tests.wire import sse_messages, tools_call

# serial: fifty clients against its own PostgreSQL or Redis, stopped and started, with
# deadlines that assume the cores are its own (tests/parallel.py).
pytestmark = [pytest.mark.live, pytest.mark.slow, pytest.mark.redis, pytest.mark.serial]

CLIENTS = 50
# Each client submits a task every half second, answered or not: a steady 100 calls a second,
# with up to fifty in flight when the service stops. Back to back they made about 7,700 tasks
# in the 20 s, nearly two minutes of CPU on two cores, and no more of the outage.
PAUSE_SECONDS = 0.5
SUBMIT_SECONDS = 20.0
OUTAGE_AT = 5.0
TERMINAL = ("completed", "failed", "cancelled")
# Short timers, so the system recovers within the test: the sweeper runs every second,
# a message the restarted broker lost is published again after 5 s, a lease lasts 5 s.
ENV = {
    "TASKDESK_TOOLSETS": "demo",
    "TASKDESK_DISPATCH_REPUBLISH_SECONDS": "5",
    "TASKDESK_LEASE_SECONDS": "5",
    "TASKDESK_SWEEP_SECONDS": "1",
}


@dataclass
class Load:
    """What the clients saw: the task ids each key was answered with, when receipts came,
    and why calls were retried."""

    receipts: dict[str, set[str]] = field(default_factory=dict)
    received_at: list[float] = field(default_factory=list)
    retried: collections.Counter[str] = field(default_factory=collections.Counter)
    unanswered: list[tuple[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _task_id(response: httpx.Response) -> str | None:
    if response.status_code != 200:
        return None
    if response.headers.get("Content-Type", "").startswith("text/event-stream"):
        body = sse_messages(response)[-1]
    else:
        body = json.loads(response.content)
    result = body.get("result") or {}
    task_id = result.get("taskId")
    return task_id if isinstance(task_id, str) else None


def _client(n: int, url: str, token: str, until: float, load: Load) -> None:
    with httpx.Client(timeout=10) as http:
        i = 0
        while time.monotonic() < until:
            started = time.monotonic()
            key = f"c{n}-{i}"
            arguments = {"payment_id": key, "amount_cents": 100, "reason": "outage test"}
            give_up = time.monotonic() + 60
            while True:
                body, headers = tools_call("refund_payment", arguments, key=key, token=token)
                try:
                    response = http.post(url, content=body, headers=headers)
                    task_id = _task_id(response)
                    why = f"HTTP {response.status_code} {response.text[:80]}"
                except httpx.HTTPError as exc:
                    task_id, why = None, type(exc).__name__
                if task_id is not None:
                    with load.lock:
                        load.receipts.setdefault(key, set()).add(task_id)
                        load.received_at.append(time.monotonic())
                    break
                with load.lock:
                    load.retried[why.split(" ", 2)[1] if why.startswith("HTTP") else why] += 1
                if time.monotonic() > give_up:
                    with load.lock:
                        load.unanswered.append((key, why))
                    break
                time.sleep(0.2)
            i += 1
            time.sleep(max(0.0, started + PAUSE_SECONDS - time.monotonic()))


def submit_for(stack: LiveStack, token: str, outage: Any) -> tuple[Load, float, float]:
    """Run the clients for SUBMIT_SECONDS; OUTAGE(load) is called OUTAGE_AT seconds in and
    returns when the service is back. Return what the clients saw and when (monotonic) the
    outage started and ended."""
    load = Load()
    started = time.monotonic()
    until = started + SUBMIT_SECONDS
    threads = [
        threading.Thread(target=_client, args=(n, stack.mcp_url, token, until, load), daemon=True)
        for n in range(CLIENTS)
    ]
    for thread in threads:
        thread.start()
    time.sleep(OUTAGE_AT)
    down = time.monotonic()
    outage(load)
    up = time.monotonic()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads)
    assert not load.unanswered, load.unanswered[:5]
    return load, down, up


def _manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [str(BIN / "python"), "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""


# Its own cluster, whatever the run's database: run once, in the PostgreSQL run of CI.
@pytest.mark.postgres
def test_postgresql_restarted_while_fifty_clients_submit() -> None:
    redis = RedisServer(free_port())
    redis.start()
    try:
        with postgres_cluster() as cluster:
            url = cluster.create_database("taskdesk_outage")
            stack = LiveStack(env={**ENV, "DATABASE_URL": url, "CELERY_BROKER_URL": redis.url})
            _manage(stack.env, "migrate", "--noinput")
            token = _manage(stack.env, "create_client_token", "--client", "c", "--tenant", "t")
            try:
                stack.start()
                worker_pid = stack.procs["worker"].pid

                def restart(load: Load) -> None:
                    cluster.stop()
                    time.sleep(3)
                    cluster.start()

                load, _down, _up = submit_for(stack, token, restart)

                with psycopg.connect(url) as db:

                    def unfinished() -> list[Any]:
                        return db.execute(
                            "SELECT id, status, leg, lease_owner FROM tasks_app_task "
                            "WHERE status NOT IN ('completed', 'failed', 'cancelled')"
                        ).fetchall()

                    wait_for(
                        "every task to end",
                        lambda: not unfinished(),
                        timeout=120,
                        every=0.5,
                        explain=lambda: f"{unfinished()[:10]}\n{stack.log('worker')[-3000:]}",
                    )
                    tasks = db.execute(
                        "SELECT id, idempotency_key, status, result, created_at FROM tasks_app_task"
                    ).fetchall()
                    refunds = db.execute(
                        "SELECT downstream_key FROM tasks_app_demorefund"
                    ).fetchall()
                    effects = db.execute("SELECT task_id, state FROM tasks_app_effect").fetchall()
                    after = db.execute(
                        "SELECT count(*) FROM tasks_app_task WHERE created_at > "
                        "(SELECT pg_postmaster_start_time())"
                    ).fetchone()
                # Not restarted: the same worker process did all of it.
                assert stack.procs["worker"].poll() is None
                assert stack.procs["worker"].pid == worker_pid
            finally:
                stack.close()
    finally:
        redis.stop()

    # The outage was real: clients had to retry, and tasks were accepted after the restart.
    # What they retried on was the 503 an outage answers, never a 500 or an error with 200.
    assert load.retried["503"] > 0, load.retried
    assert not set(load.retried) & {"200", "500"}, load.retried
    assert after is not None and after[0] > 0
    # Every key is exactly one task, and every receipt of a key named that task.
    by_key = {key: task_id for task_id, key, *_ in tasks}
    assert len(by_key) == len(tasks) == len(load.receipts)
    for key, task_ids in load.receipts.items():
        assert task_ids == {by_key[key]}, (key, task_ids)
    # Every task ended well, and every refund happened once.
    assert {status for _, _, status, _, _ in tasks} == {"completed"}
    assert all(result["isError"] is False for *_, result, _ in tasks)
    assert len(refunds) == len(set(refunds)) == len(tasks)
    assert sorted(task_id for task_id, _ in effects) == sorted(by_key.values())
    assert {state for _, state in effects} == {"confirmed"}
    print(f"\n{len(tasks)} tasks; retried: {dict(load.retried)}")


def test_redis_stopped_for_10_s_while_fifty_clients_submit(transactional_db, settings) -> None:
    from tasks_app import tokens
    from tasks_app.clients import client_get_or_create

    token = tokens.issue(client_get_or_create(name="c", tenant="t"))
    redis = RedisServer(free_port())
    redis.start()
    try:
        with live_stack(env={**ENV, "CELERY_BROKER_URL": redis.url}) as stack:

            def stop_for_10_s(load: Load) -> None:
                redis.stop()
                time.sleep(10)
                redis.start()

            load, down, up = submit_for(stack, token, stop_for_10_s)
            tasks = list(Task.objects.all())
            wait_for(
                "every task to end",
                lambda: not Task.objects.exclude(status__in=TERMINAL).exists(),
                timeout=120,
                every=0.5,
                explain=lambda: stack.log("worker")[-3000:],
            )
    finally:
        redis.stop()

    # Receipts kept coming back while the broker was away.
    during = [at for at in load.received_at if down + 1 < at < up - 1]
    assert len(during) > CLIENTS, (len(during), load.retried)
    by_key = {task.idempotency_key: task.pk for task in Task.objects.all()}
    assert len(by_key) == len(load.receipts) >= len(tasks)
    for key, task_ids in load.receipts.items():
        assert task_ids == {by_key[key]}, (key, task_ids)
    # Every task ran once: one leg each, one refund each.
    for task in Task.objects.all():
        assert task.status == Status.COMPLETED, task.pk
        assert task.result["isError"] is False
        legs = task.events.filter(kind="leg_started").count()
        assert legs == 1, (task.pk, list(task.events.values_list("kind", flat=True)))
    assert DemoRefund.objects.count() == Task.objects.count()
    assert set(Effect.objects.values_list("state", flat=True)) == {"confirmed"}
    print(f"\n{Task.objects.count()} tasks; retried: {dict(load.retried)}")
