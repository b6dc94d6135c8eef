"""config.celery.share_priority_with_session: a worker started at a lower priority gives its
session's scheduling group (Linux autogroup) the same priority, and only when it leads that
session."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.live import ROOT

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/autogroup").exists(), reason="needs a Linux kernel with autogroup"
)

PROBE = """
import os, sys
os.nice(int(sys.argv[1]))
from config.celery import share_priority_with_session
share_priority_with_session()
print(open("/proc/self/autogroup").read().split()[-1])
"""


def _group_nice_after(nice: int, *, own_session: bool) -> str:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(nice)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        start_new_session=own_session,
    )
    return done.stdout.strip()


def test_a_session_leader_started_at_nice_7_puts_its_session_at_nice_7() -> None:
    assert _group_nice_after(7, own_session=True) == "7"


def test_at_nice_0_the_session_keeps_its_priority() -> None:
    assert _group_nice_after(0, own_session=True) == "0"


def test_a_process_inside_someone_elses_session_leaves_that_session_alone() -> None:
    before = Path("/proc/self/autogroup").read_text().split()[-1]
    assert _group_nice_after(7, own_session=False) == before
    assert Path("/proc/self/autogroup").read_text().split()[-1] == before
