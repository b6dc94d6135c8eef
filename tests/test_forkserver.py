"""The test fork server's warm processes (tests/forkserver.py): a live stack's programs start
with Django already set up in their environment, their exit status comes back as a cold
program's does, and an environment whose set-up fails starts its programs cold."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests import forkserver

ROOT = Path(__file__).resolve().parent.parent

# What the program reports: whether Django's apps were loaded before it did anything, and
# whether it became the fork server's child (a warm process's program does once the child that
# forked it has exited, a moment later); then it exits with 3.
PROGRAM = """
import os, sys, time
from django.apps import apps
ready = apps.ready
server = int(os.environ["FORK_SERVER"])
deadline = time.monotonic() + 10
while os.getppid() != server and time.monotonic() < deadline:
    time.sleep(0.01)
print(ready, os.getppid() == server, flush=True)
sys.exit(3)
"""

pytestmark = pytest.mark.skipif(not forkserver.enabled(), reason="TASKDESK_TEST_FORKSERVER=0")


def start(env: dict[str, str], *, warm: bool) -> tuple[bool, bool, int]:
    """Run PROGRAM through the fork server: (Django was set up, it became the server's child,
    its exit status)."""
    read, write = os.pipe()
    try:
        proc = forkserver.spawn(
            [sys.executable, "-c", PROGRAM],
            cwd=ROOT,
            env=env,
            stdout=write,
            stderr=write,
            start_new_session=True,
            warm=warm,
        )
    finally:
        os.close(write)
    with os.fdopen(read) as output:
        said = output.read().split()
    code = proc.wait(60)
    assert len(said) == 2, said
    return said[0] == "True", said[1] == "True", code


def stack_environment(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "TASKDESK_VAR_DIR": str(tmp_path),
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "CELERY_BROKER_URL": "filesystem://",
        "FORK_SERVER": str(forkserver._the_server().proc.pid),
        **extra,
    }


def test_the_programs_of_one_environment_start_with_django_set_up(tmp_path) -> None:  # type: ignore[no-untyped-def]
    env = stack_environment(tmp_path)
    first = start(env, warm=True)
    second = start(env, warm=True)
    cold = start(env, warm=False)

    assert first[0] and second[0], "a warm program found Django not set up"
    assert not cold[0]
    # Each is the server's child, as a cold one is, and its exit status comes back the same way.
    assert first[1] and second[1] and cold[1]
    assert first[2] == second[2] == cold[2] == 3


def test_an_environment_whose_set_up_fails_starts_its_programs_cold(tmp_path) -> None:  # type: ignore[no-untyped-def]
    env = stack_environment(tmp_path, TASKDESK_LEASE_SECONDS="soon")
    # The program itself does not read the settings, so it runs; its warm process could not.
    ready, adopted, code = start(env, warm=True)
    assert not ready and adopted
    assert code == 3
