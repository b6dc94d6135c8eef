"""The lease of a running leg: renewed while the tool runs, and lost to a takeover."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import psycopg
import pytest
import time_machine
from django.db import OperationalError, connection
from django.utils import timezone

from tasks_app import dispatch, runtime
from tasks_app.db import claiming, prepared
from tasks_app.models import Dispatch, Effect, Status, Task
from tasks_app.runtime import LegOutcome, leases
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


# --- fencing: a leg that lost its lease writes nothing -----------------------------------


@pytest.mark.parametrize("how", ["taken_over", "expired"])
def test_the_outcome_of_an_effect_whose_leg_lost_its_lease_is_refused(alice, how: str) -> None:
    task = submit(alice, "loses_lease_in_effect", how=how)
    owner_before = set(Task.objects.filter(pk=task.pk).values_list("lease_owner", flat=True))

    outcome = runtime.run_leg(task_id=task.pk, dispatch_id=next_dispatch(task))

    task.refresh_from_db()
    assert outcome == LegOutcome.LEASE_LOST
    assert task.status == Status.WORKING
    # The effect stays as its intent left it: the next leg settles it (verify, or an operator).
    effect = Effect.objects.get(task=task)
    assert (effect.state, effect.detail) == ("intended", {})
    assert events(task) == ["leg_started", "effect_intended"]
    assert owner_before == {""}
    if how == "expired":
        # Nobody took over: the lease is left for the sweeper to expire.
        assert task.lease_owner.startswith(task.events.get(kind="leg_started").actor)


def test_a_lease_expired_by_the_database_clock_is_not_renewed(alice) -> None:
    task = submit(alice, "noop")
    claim = leases.claim(task_id=task.pk, dispatch_id=next_dispatch(task), owner="w:1:a")
    assert claim is not None
    assert leases.renew(task.pk, "w:1:a", claim.task.leg)
    assert not leases.renew(task.pk, "w:1:a", claim.task.leg + 1)  # another generation

    Task.objects.filter(pk=task.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))

    assert not leases.renew(task.pk, "w:1:a", claim.task.leg)
    task.refresh_from_db()
    assert task.lease_expires_at < timezone.now()  # a lease is never revived


def test_leases_are_set_and_compared_on_the_database_clock_not_the_workers(alice) -> None:
    live = submit(alice, "noop")
    first = leases.claim(task_id=live.pk, dispatch_id=next_dispatch(live), owner="w:1:a")
    assert first is not None and first.task.lease_expires_at is not None
    # The expiry is the database's time plus the lease (1 s here), whatever this clock says.
    assert abs((first.task.lease_expires_at - timezone.now()).total_seconds() - 1) < 0.5
    dispatch.enqueue(live, reason="test")

    # This process's clock runs 60 s ahead: the lease still looks live to the database, so
    # a second leg cannot take it, the sweeper does not expire it, and it can be renewed.
    with time_machine.travel(timezone.now() + timedelta(seconds=60), tick=True):
        assert leases.claim(task_id=live.pk, dispatch_id=next_dispatch(live), owner="w:2:b") is None
        assert runtime.redispatch_expired_leases() == 0
        assert leases.renew(live.pk, "w:1:a", first.task.leg)
        later = submit(alice, "noop")
        claim = leases.claim(task_id=later.pk, dispatch_id=next_dispatch(later), owner="w:2:b")
        assert claim is not None and claim.task.lease_expires_at is not None
        expires = claim.task.lease_expires_at
    assert abs((expires - timezone.now()).total_seconds() - 1) < 0.5

    # And 60 s behind: an expired lease is expired, whatever this clock says.
    Task.objects.filter(pk=live.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    with time_machine.travel(timezone.now() - timedelta(seconds=60), tick=True):
        assert not leases.renew(live.pk, "w:1:a", first.task.leg)
        assert runtime.redispatch_expired_leases() == 1


@pytest.mark.django_db(transaction=True)
def test_the_renewer_stops_a_leg_it_could_not_renew_before_its_lease_ran_out(
    alice, monkeypatch
) -> None:
    task = submit(alice, "sleeper", seconds=5)

    def unreachable(*args: object, **kwargs: object) -> bool:
        raise OperationalError("the database is unreachable")

    monkeypatch.setattr(leases, "renew", unreachable)
    started = time.monotonic()
    outcome = runtime.run_leg(task_id=task.pk, dispatch_id=next_dispatch(task))

    task.refresh_from_db()
    assert outcome == LegOutcome.LEASE_LOST
    assert time.monotonic() - started < 3  # within the 1 s lease and a checkpoint, not 5 s
    assert task.status == Status.WORKING
    assert events(task) == ["leg_started"]


# --- fair claiming across tenants --------------------------------------------------------


def test_one_tenants_backlog_does_not_starve_another_tenant(alice, bob) -> None:
    backlog = [submit(alice, "noop") for _ in range(5)]
    running = leases.claim(
        task_id=backlog[0].pk, dispatch_id=next_dispatch(backlog[0]), owner="w:1:a"
    )
    assert running is not None  # acme has a leg running and four tasks waiting
    later = submit(bob, "noop")  # globex's only task, newer than all of acme's

    first = leases.claim_next(owner="w:2:b")
    assert first is not None and first.claim is not None
    assert first.claim.task.pk == later.pk  # the tenant with nothing running goes first

    # Now each tenant has one leg running: the oldest waiting record goes next.
    second = leases.claim_next(owner="w:3:c")
    assert second is not None and second.claim is not None
    assert second.claim.task.pk == backlog[1].pk
    # Each record is consumed once, whichever way it was taken.
    assert Dispatch.objects.filter(consumed_at__isnull=True).count() == 3


def test_records_written_before_records_had_tenants_are_still_taken(alice) -> None:
    old = submit(alice, "noop")
    Dispatch.objects.filter(task=old).update(tenant=None)

    found = leases.claim_next(owner="w:1:a")

    assert found is not None and found.claim is not None and found.claim.task.pk == old.pk


# --- where a worker starts looking ------------------------------------------------------------


def _floor(monkeypatch, *, hint: int, low: int, full_ago: float = 0.0) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(leases._floor, "hint", hint)
    monkeypatch.setattr(leases._floor, "low", low)
    monkeypatch.setattr(leases._floor, "full_at", time.monotonic() - full_ago)


def record_of(task: Task) -> int:
    return Dispatch.objects.get(task=task).pk


# The bounds are PostgreSQL's (its index keeps the entries of consumed records until
# vacuumed); SQLite always looks from the start.


@pytest.mark.postgres
def test_a_record_below_the_hint_is_found_by_a_thorough_look(alice, monkeypatch) -> None:
    """A look starts at the oldest record waiting last time; one committed late under an
    older id is found by the thorough look a drainer makes before it stops."""
    late, early = submit(alice, "noop"), submit(alice, "noop")
    _floor(monkeypatch, hint=record_of(early), low=record_of(late))

    first = leases.claim_next(owner="w:1:a")
    assert first is not None and first.claim is not None
    assert first.claim.task.pk == early.pk
    assert leases.claim_next(owner="w:1:a") is None  # below the hint: not seen
    found = leases.claim_next(owner="w:1:a", thorough=True)
    assert found is not None and found.dispatch_id == record_of(late)


@pytest.mark.postgres
def test_a_record_below_every_bound_is_found_by_the_next_full_look(alice, monkeypatch) -> None:
    late, early = submit(alice, "noop"), submit(alice, "noop")
    _floor(monkeypatch, hint=record_of(early), low=record_of(early))
    leases.claim_next(owner="w:1:a")  # takes early
    assert leases.claim_next(owner="w:1:a", thorough=True) is None

    monkeypatch.setattr(leases._floor, "full_at", time.monotonic() - leases._Floor.FULL_EVERY - 1)
    found = leases.claim_next(owner="w:1:a")

    assert found is not None and found.dispatch_id == record_of(late)


def test_a_drainer_finds_a_record_below_its_hint_before_it_stops(alice, monkeypatch) -> None:
    late, early = submit(alice, "noop"), submit(alice, "noop")
    _floor(monkeypatch, hint=record_of(early), low=record_of(late))

    assert runtime.run_waiting_legs(seconds=5) == 2

    for task in (late, early):
        task.refresh_from_db()
        assert task.status == Status.COMPLETED


def test_after_an_empty_look_the_next_starts_past_the_newest_record(alice, monkeypatch) -> None:
    task = submit(alice, "noop")
    leases.claim_next(owner="w:1:a")

    assert leases.claim_next(owner="w:1:a", thorough=True) is None

    if connection.vendor == "postgresql":  # past the newest record: nothing to walk over
        assert leases._floor.hint == record_of(task) + 1
    newer = submit(alice, "noop")
    found = leases.claim_next(owner="w:1:a")
    assert found is not None and found.dispatch_id == record_of(newer)


def _rows_removed_by_filter(plan: dict) -> int:  # type: ignore[type-arg]
    own = int(plan.get("Rows Removed by Filter", 0))
    return own + sum(_rows_removed_by_filter(child) for child in plan.get("Plans", []))


@pytest.mark.postgres
def test_a_look_reads_no_waiting_record_but_the_ones_it_takes(alice) -> None:
    """The generic plan a prepared look runs with, before any ANALYZE (a new database, or
    autovacuum off): the oldest record of no tenant is one index lookup, not a walk over
    every waiting record that reads each row to check its tenant."""
    for _ in range(200):
        submit(alice, "noop")
    statement, names = prepared.native_statement(claiming.FAIR_NEXT_POSTGRESQL)
    assert names == ("floor",)
    raw = connection.connection  # server-side parameters, as the prepared look has
    with psycopg.RawCursor(raw) as cursor:
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute(b"EXPLAIN (ANALYZE, FORMAT JSON) " + statement, [0])
        plan = cursor.fetchone()[0][0]["Plan"]

    assert _rows_removed_by_filter(plan) == 0


def test_the_renewer_thread_ends_with_the_last_leg_and_the_next_leg_starts_another(db) -> None:  # type: ignore[no-untyped-def]
    renewer = leases._Renewer()
    first = leases.Lease("a-task", "w:1:a", 1, time.monotonic())
    renewer.add(first)
    thread = renewer._thread
    assert thread is not None and thread.is_alive()
    renewer.remove(first)
    thread.join(timeout=5)  # at its next tick, with no leg left
    assert not thread.is_alive() and renewer._thread is None
    second = leases.Lease("b-task", "w:1:a", 1, time.monotonic())
    renewer.add(second)
    try:
        assert renewer._thread is not None and renewer._thread.is_alive()
        assert renewer._thread is not thread
    finally:
        renewer.remove(second)
