"""The lease of a running leg: renewed while the tool runs, and lost to a takeover."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from tasks_app import runtime
from tasks_app.models import Status, Task
from tasks_app.runtime import LegOutcome
from tests.tasks_app.runtime.helpers import events, next_dispatch, submit


@pytest.fixture(autouse=True)
def _short_lease(settings):  # type: ignore[no-untyped-def]
    settings.TASKDESK_LEASE_SECONDS = 1


def in_thread(fn, *, every: float, stop: threading.Event) -> list[object]:  # type: ignore[no-untyped-def]
    """Call FN every EVERY seconds in a thread (with its own connection) until STOP."""
    seen: list[object] = []

    def loop() -> None:
        try:
            while not stop.wait(every):
                seen.append(fn())
        finally:
            connection.close()

    threading.Thread(target=loop, daemon=True).start()
    return seen


@pytest.mark.django_db(transaction=True)
def test_a_leg_longer_than_its_lease_keeps_it_by_renewing(alice) -> None:
    task = submit(alice, "sleeper", seconds=2.5)
    stop = threading.Event()
    sweeps = in_thread(runtime.redispatch_expired_leases, every=0.2, stop=stop)

    try:
        outcome = runtime.run_leg(task_id=task.pk, dispatch_id=next_dispatch(task))
    finally:
        stop.set()

    task.refresh_from_db()
    assert outcome == LegOutcome.COMPLETED
    assert len(sweeps) >= 8
    assert set(sweeps) == {0}  # the sweeper never found the lease expired
    assert task.leg == 1
    assert "lease_expired" not in events(task)


@pytest.mark.django_db(transaction=True)
def test_a_leg_whose_lease_was_taken_over_stops_and_writes_nothing_more(alice) -> None:
    task = submit(alice, "sleeper", seconds=5)
    stop = threading.Event()

    def steal() -> int:
        # What a new leg does once the sweeper decided this one was dead.
        return (
            Task.objects.filter(pk=task.pk)
            .exclude(lease_owner="")
            .update(lease_owner="newer:1:abc")
        )

    in_thread(steal, every=0.3, stop=stop)
    started = time.monotonic()
    try:
        outcome = runtime.run_leg(task_id=task.pk, dispatch_id=next_dispatch(task))
    finally:
        stop.set()

    task.refresh_from_db()
    assert outcome == LegOutcome.LEASE_LOST
    assert time.monotonic() - started < 2  # noticed within one renewal interval
    assert task.status == Status.WORKING
    assert task.lease_owner == "newer:1:abc"
    assert events(task) == ["leg_started"]
