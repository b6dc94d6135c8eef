"""bench/shipped.py's arithmetic: which process a CPU second belongs to, and the ratios."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def shipped():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(BENCH))  # it imports its sibling `common`
    try:
        spec = importlib.util.spec_from_file_location("shipped", BENCH / "shipped.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCH))


@pytest.mark.parametrize(
    ("cmd", "parent", "group"),
    [
        (".venv/bin/python .venv/bin/gunicorn config.wsgi -c config/gunicorn.conf.py", "", "web"),
        (
            ".venv/bin/celery -A config worker --pool prefork --queues celery",
            ".venv/bin/python scripts/run_procfile.py -f Procfile --port 8000",
            "worker main",
        ),
        (
            ".venv/bin/celery -A config worker --pool prefork --queues celery",
            ".venv/bin/celery -A config worker --queues celery",
            "worker pool",
        ),
        (
            ".venv/bin/celery -A config worker --pool solo --queues control --embed-beat -s var/s",
            "",
            "control worker and beat",
        ),
        (".venv/bin/celery -A config beat --loglevel INFO", "", "control worker and beat"),
        (".venv/bin/python scripts/run_procfile.py -f Procfile", "make run", "supervisor"),
        # The titles of make run's processes forked from its supervisor (setproctitle).
        ("gunicorn: worker [taskdesk-web]", "gunicorn: master [taskdesk-web]", "web"),
        (
            "[celeryd: worker@h:MainProcess] -active- (-A config worker --pool prefork --queues "
            "celery --loglevel INFO -n worker@%h)",
            ".venv/bin/python scripts/run_procfile.py -f Procfile --preload config.preload",
            "worker main",
        ),
        (
            "[celeryd: worker@h:ForkPoolWorker-1]",
            "[celeryd: worker@h:MainProcess] -active- (-A config worker --pool prefork)",
            "worker pool",
        ),
        (
            "[celeryd: control@h:MainProcess] -active- (-A config worker --pool solo --queues "
            "control --embed-beat -s var/celerybeat-schedule)",
            ".venv/bin/python scripts/run_procfile.py -f Procfile --preload config.preload",
            "control worker and beat",
        ),
        ("postgres: 15/main: postgres taskdesk 127.0.0.1(5050) idle", "", "PostgreSQL"),
        ("redis-server 127.0.0.1:6379", "", "Redis"),
        ("/usr/bin/bash something else", "", None),
    ],
)
def test_processes_are_counted_in_their_group(shipped, cmd, parent, group) -> None:  # type: ignore[no-untyped-def]
    assert shipped._group(cmd, parent) == group


def test_ratios_favour_taskdesk_above_one_for_rates_and_latencies(shipped) -> None:  # type: ignore[no-untyped-def]
    rows = [
        {"label": "taskdesk", "figure": "accept", "rep": 1, "ok_rps": 300.0, "p99_ms": 100.0},
        {"label": "taskdesk", "figure": "accept", "rep": 2, "ok_rps": 500.0, "p99_ms": 60.0},
        {"label": "fastmcp-tasks redis-x2", "figure": "accept", "rep": 1, "ok_rps": 200.0, "p99_ms": 160.0},
    ]  # fmt: skip

    table = shipped.ratio_table(rows).splitlines()

    assert "| accept, req/s | 400.0 | 200.0 | 2.00 |" in table  # the median of ours
    assert "| accept p99, ms | 80.0 | 160.0 | 2.00 |" in table  # peer / ours for latencies
    assert not any(line.startswith("| tasks/get") for line in table)  # not measured


def test_without_the_peer_the_table_has_our_column_only(shipped) -> None:  # type: ignore[no-untyped-def]
    rows = [{"label": "taskdesk", "figure": "e2e", "rep": 1, "tasks_per_s": 120.5}]

    assert shipped.ratio_table(rows).splitlines()[-1] == "| end to end, tasks/s | 120.5 |"


def test_memory_counts_a_forked_child_and_shares_its_pages_in_pss(shipped) -> None:  # type: ignore[no-untyped-def]
    import os
    import subprocess

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        peak, current, pss, count = shipped.rss_of(os.getpid())
        alone_peak, alone_current, _, _ = shipped.rss_of(child.pid)
    finally:
        child.kill()
        child.wait()

    assert count >= 2  # this process and its child (and whatever else it started)
    assert 0 < alone_current <= alone_peak
    assert current > alone_current and peak >= current
    assert 0 < pss <= current  # PSS never counts a shared page more than RSS does


def test_the_memory_line_gives_peak_rss_beside_the_peer_and_pss(shipped) -> None:  # type: ignore[no-untyped-def]
    rows = [{"label": "fastmcp-tasks redis-x2", "figure": "rss", "hwm_kb": 240 * 1024}]

    line = shipped.rss_line(rows, (900 * 1024, 880 * 1024, 540 * 1024, 15))

    assert "sum of VmHWM over 15 processes" in line
    assert "900 MiB; the peer's two processes: 240 MiB" in line
    assert "880 MiB of RSS and 540 MiB of PSS" in line


def test_the_webhook_table_compares_the_medians_with_and_without(shipped) -> None:  # type: ignore[no-untyped-def]
    result = {
        "figures": {
            "without": {"accept": [600.0, 580.0], "e2e": [300.0, 280.0]},
            "with": {"accept": [570.0, 560.0], "e2e": [240.0, 260.0]},
        }
    }
    rows = shipped.webhook_table(result).splitlines()
    assert rows[2] == "| accept, req/s | 590.0 | 565.0 | 0.96 |"
    assert rows[3] == "| end to end, tasks/s | 290.0 | 250.0 | 0.86 |"


def test_the_webhook_table_shows_how_an_end_to_end_tasks_cost_moved(shipped) -> None:  # type: ignore[no-untyped-def]
    costs = {"gets": [1.0, 1.2], "control worker and beat": [0.1, 0.1], "PostgreSQL": [2.0, 2.2],
             "web": [5.0, 5.0], "total": [10.0, 11.0]}  # fmt: skip
    more = {"gets": [2.0, 2.4], "control worker and beat": [1.0, 0.8], "PostgreSQL": [2.6, 2.6],
            "web": [6.0, 7.0], "total": [13.0, 14.0]}  # fmt: skip
    result = {
        "figures": {
            "without": {"accept": [600.0], "e2e": [300.0], **costs},
            "with": {"accept": [570.0], "e2e": [240.0], **more},
        }
    }
    rows = shipped.webhook_table(result).splitlines()
    assert rows[4] == "| `tasks/get` per end-to-end task | 1.10 | 2.20 | 2.00 |"
    assert (
        rows[5] == "| end to end, CPU ms per task: control worker and beat | 0.10 | 0.90 | 9.00 |"
    )
    assert rows[8] == "| end to end, CPU ms per task: total | 10.50 | 13.50 | 1.29 |"
