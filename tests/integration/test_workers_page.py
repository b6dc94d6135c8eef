"""/workers/ against a real worker: the leg of a running 30 s task shows on the node that runs
it within 3 s of its start, and a worker stopped with SIGSTOP is marked stale within
TASKDESK_WORKER_STALE_SECONDS (issue 35). The page is read from the stack's own gunicorn, as a
browser would, with a signed-in superuser's session."""

from __future__ import annotations

import os
import re
import signal
import time

import httpx
import pytest
from django.conf import settings as django_settings
from django.test import Client as DjangoClient

from tasks_app.models import TaskEvent, WorkerHeartbeat
from tests.integration.worker_helpers import submit
from tests.live import live_stack, wait_for

pytestmark = [pytest.mark.live, pytest.mark.slow]

STALE_SECONDS = 4
HEARTBEAT_SECONDS = 1
# How soon a leg must show on its node after it started (the page polls every 2 s).
SHOWN_WITHIN = 3.0
# How often this test reads the page.
EVERY = 0.1


def card(html: str, name: str) -> str:
    found = re.search(rf'<article[^>]*data-node="{re.escape(name)}".*?</article>', html, re.S)
    assert found, f"no card of {name} on the page"
    return found.group(0)


def test_a_running_leg_shows_on_its_node_and_a_stopped_worker_turns_stale(
    transactional_db, django_user_model, alice
) -> None:
    env = {
        "TASKDESK_WORKER_STALE_SECONDS": str(STALE_SECONDS),
        "TASKDESK_HEARTBEAT_SECONDS": str(HEARTBEAT_SECONDS),
    }
    with live_stack(env=env) as stack:
        signed_in = DjangoClient()
        signed_in.force_login(django_user_model.objects.create_superuser("root", password="pw-1"))
        cookies = {django_settings.SESSION_COOKIE_NAME: signed_in.cookies["sessionid"].value}

        def read() -> str:
            response = httpx.get(f"{stack.url}/workers/", cookies=cookies, timeout=10)
            assert response.status_code == 200, response.text[:500]
            return response.text

        prefix = f"worker-{stack.port}@"
        row = wait_for(
            "the leg worker's heartbeat with its pool",
            lambda: WorkerHeartbeat.objects.filter(
                hostname__startswith=prefix, detail__has_key="pids"
            ).first(),
            timeout=30,
        )
        node = row.hostname
        assert sorted(row.detail["pids"]) == stack.pool_pids()
        assert row.detail["pid"] == stack.procs["worker"].pid

        task = submit(alice, "slow_echo", text="thirty seconds", seconds=30)
        started = wait_for(
            "the leg's start",
            lambda: TaskEvent.objects.filter(task=task, kind="leg_started").first(),
            timeout=30,
            every=0.01,
        )

        def shown() -> str | None:
            page = read()
            return page if f'id="running-{task.pk}"' in card(page, node) else None

        html = wait_for("the leg on its node's card", shown, timeout=30, every=EVERY)
        shown_after = time.time() - started.created_at.timestamp()
        assert shown_after <= SHOWN_WITHIN, f"shown {shown_after:.2f} s after the leg started"
        pid = int(started.actor.split(":")[1])
        assert pid in stack.pool_pids()
        assert re.search(rf'id="running-{task.pk}".*?<td class="mono">{pid}</td>', html, re.S)
        assert "Stale" not in card(html, node)

        main = stack.procs["worker"].pid
        os.kill(main, signal.SIGSTOP)  # its heartbeat thread stops; the pool runs on
        stopped = time.monotonic()
        try:
            asked = _first_stale(read, node)
            # The last heartbeat came at most one interval before the stop, so the page must
            # mark the node once STALE_SECONDS have passed since the stop, and not long before.
            marked_after = asked - stopped
            assert STALE_SECONDS - HEARTBEAT_SECONDS - 0.5 <= marked_after <= STALE_SECONDS + 0.5, (
                f"marked stale {marked_after:.2f} s after the stop"
            )
            stale = card(read(), node)
            # Its legs say when their leases run out (the pool process still renews them).
            assert re.search(rf'id="running-{task.pk}".*?runs out in', stale, re.S)
        finally:
            os.kill(main, signal.SIGCONT)

        wait_for(
            "the node fresh again",
            lambda: 'class="node"' in card(read(), node),
            timeout=10,
            every=EVERY,
        )
        assert f'id="running-{task.pk}"' in card(read(), node)


def _first_stale(read: object, node: str) -> float:
    """The monotonic time at which the first read that shows NODE stale was sent."""
    assert callable(read)
    deadline = time.monotonic() + 3 * STALE_SECONDS
    while time.monotonic() < deadline:
        sent = time.monotonic()
        if "node-stale" in card(read(), node):
            return sent
        time.sleep(EVERY)
    raise AssertionError(f"{node} never turned stale in {3 * STALE_SECONDS} s")
