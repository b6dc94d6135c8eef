"""Separate processes racing with the same idempotency key: exactly one task.

Each process has its own database connection, as web processes do; they all submit at the
same instant. Runs on the database of the run (SQLite with its IMMEDIATE transactions, or
PostgreSQL with its one-statement insert-or-get).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from tasks_app.models import Dispatch, Task, TaskEvent
from tests.live import ROOT, database_url

PROCESSES = 6


def test_racing_processes_create_exactly_one_task(transactional_db, alice, settings) -> None:
    env = {**os.environ, "DATABASE_URL": database_url(), "SECRET_KEY": settings.SECRET_KEY}
    start_at = time.time() + 4  # after every process has set Django up
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.integration.race_submitter",
                "alice",
                "k-race",
                str(start_at),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(PROCESSES)
    ]
    outputs = [proc.communicate(timeout=60) for proc in procs]
    for proc, (_out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err[-2000:]
    receipts = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]

    task = Task.objects.get()
    assert {r["task"] for r in receipts} == {task.pk}
    assert sorted(r["replayed"] for r in receipts) == [False] + [True] * (PROCESSES - 1)
    assert Dispatch.objects.filter(task=task).count() == 1
    kinds = sorted(TaskEvent.objects.filter(task=task).values_list("kind", flat=True))
    assert kinds == ["accepted"] + ["duplicate_submission"] * (PROCESSES - 1)
