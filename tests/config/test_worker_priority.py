"""config.celery.run_below: a leg worker lowers its priority, and its session's scheduling
group's (Linux autogroup) when it leads that session; settings.WORKER_NICE's default."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.live import ROOT

needs_autogroup = pytest.mark.skipif(
    not Path("/proc/self/autogroup").exists(), reason="needs a Linux kernel with autogroup"
)

# /proc/PID/autogroup is empty for a process in the kernel's root scheduling group: one
# whose session began before autogroup was on, such as a service's or a container's.
PROBE = """
import os, sys
from config.celery import run_below
run_below(int(sys.argv[1]))
group = open("/proc/self/autogroup").read().split()
print(os.getpriority(os.PRIO_PROCESS, 0), group[-1] if group else "root")
"""


def _own_group() -> str:
    group = Path("/proc/self/autogroup").read_text().split()
    return group[-1] if group else "root"


def _nice_after(nice: int, *, own_session: bool) -> tuple[str, str]:
    """(the process's nice, its session group's) after run_below(NICE)."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(nice)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        start_new_session=own_session,
    )
    process, group = done.stdout.split()
    return process, group


@needs_autogroup
def test_a_session_leader_run_below_7_puts_its_session_at_nice_7() -> None:
    assert _nice_after(7, own_session=True) == ("7", "7")


@needs_autogroup
def test_below_0_nothing_changes() -> None:
    assert _nice_after(0, own_session=True) == ("0", "0")


@needs_autogroup
def test_a_process_inside_someone_elses_session_leaves_that_session_alone() -> None:
    before = _own_group()
    assert _nice_after(7, own_session=False) == ("7", before)
    assert _own_group() == before


@pytest.mark.parametrize(
    ("database_url", "expected"),
    [("postgres://u@127.0.0.1/db", 10), ("sqlite:////tmp/x.sqlite3", 0), ("", 0)],
)
def test_the_leg_worker_runs_at_nice_10_on_postgresql_and_0_on_sqlite(
    database_url: str, expected: int
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", "from django.conf import settings; print(settings.WORKER_NICE)"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "DATABASE_URL": database_url,
            "WORKER_NICE": "",
        },
    )
    assert done.stdout.strip() == str(expected)
