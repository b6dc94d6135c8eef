"""A worker's heartbeat row: what it says of the worker's pool (``tasks.PoolDetail``), and the
thread that writes it every TASKDESK_HEARTBEAT_SECONDS and at once when the pool changes."""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

from tasks_app import tasks
from tasks_app.models import WorkerHeartbeat
from tasks_app.tasks import PoolDetail


class Pool:
    """A stand-in for a Celery pool: its ``info``, as the pool of KIND reports it."""

    def __init__(self, kind: str, **info: Any) -> None:
        self.figures = {"implementation": f"celery.concurrency.{kind}:TaskPool", **info}

    @property
    def info(self) -> dict[str, Any]:
        return dict(self.figures)


class Broken:
    @property
    def info(self) -> dict[str, Any]:
        raise AttributeError("'TaskPool' object has no attribute '_pool'")  # not started yet


def test_a_prefork_pool_reports_its_processes_and_the_ones_it_replaced() -> None:
    pool = Pool("prefork", **{"max-concurrency": 2, "processes": [12, 11]})
    seen = PoolDetail(pool)

    first = seen.detail()

    assert first == {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "pool": "prefork",
        "concurrency": 2,
        "pids": [11, 12],
        "former_pids": [],
        "started_at": seen.started_at,
    }
    pool.figures["processes"] = [11, 13]  # 12 died and was replaced
    assert seen.detail()["former_pids"] == [12]
    pool.figures["processes"] = [14, 13]
    second = seen.detail()
    assert (second["pids"], second["former_pids"]) == ([13, 14], [11, 12])


def test_former_processes_are_kept_newest_first_and_bounded() -> None:
    pool = Pool("prefork", **{"max-concurrency": 1, "processes": [1000]})
    seen = PoolDetail(pool)
    seen.detail()
    for pid in range(1001, 1001 + PoolDetail.FORMER_KEPT + 5):
        pool.figures["processes"] = [pid]
        detail = seen.detail()
    assert len(detail["former_pids"]) == PoolDetail.FORMER_KEPT
    assert detail["former_pids"][0] == detail["pids"][0] - 1


def test_a_pool_without_processes_of_its_own_runs_legs_in_the_main_process() -> None:
    solo = PoolDetail(Pool("solo", **{"max-concurrency": 1, "processes": [os.getpid()]}))
    threads = PoolDetail(Pool("thread", **{"max-concurrency": 8, "threads": 0}))
    assert solo.detail()["pids"] == [os.getpid()]
    assert threads.detail()["pool"] == "thread"
    assert threads.detail()["pids"] == [os.getpid()]
    assert threads.detail()["concurrency"] == 8


def test_a_pool_that_cannot_say_yet_is_reported_as_the_main_process() -> None:
    detail = PoolDetail(Broken()).detail()
    assert (detail["pool"], detail["concurrency"], detail["pids"]) == ("", None, [os.getpid()])


def test_the_thread_writes_the_row_at_once_when_the_pool_changes(
    transactional_db, settings
) -> None:
    settings.TASKDESK_HEARTBEAT_SECONDS = 60  # only a change writes again within the test
    pool = Pool("prefork", **{"max-concurrency": 2, "processes": [21, 22]})
    tasks._stop_heartbeat.clear()
    thread = threading.Thread(
        target=tasks._heartbeats, args=("worker@w9", "celery", PoolDetail(pool))
    )
    thread.start()
    try:
        row = _wait_for(lambda: WorkerHeartbeat.objects.filter(hostname="worker@w9").first())
        assert (row.queues, row.detail["pids"]) == ("celery", [21, 22])
        pool.figures["processes"] = [21, 23]
        row = _wait_for(
            lambda: WorkerHeartbeat.objects.filter(
                hostname="worker@w9", detail__pids=[21, 23]
            ).first()
        )
        assert row.detail["former_pids"] == [22]
    finally:
        tasks._stop_heartbeat.set()
        thread.join(5)
    assert not thread.is_alive()


def _wait_for(check: Any, timeout: float = 5) -> Any:
    deadline = time.monotonic() + timeout
    while (found := check()) is None:
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return found
