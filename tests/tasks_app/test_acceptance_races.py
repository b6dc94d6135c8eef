"""acceptance.accept against a concurrent transaction holding the same key.

A second thread (its own database connection) inserts the winning row and keeps its
transaction open while accept runs: accept must wait for it, then replay the committed
winner, create its own task if the winner rolled back, or refuse a reused key. This is the
race the (client, key) constraint decides, made deterministic.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection, transaction

from tasks_app import acceptance
from tasks_app.acceptance import IdempotencyKeyReused
from tasks_app.models import Era, JournalEntry, Task, TaskEvent
from tests.tasks_app.acceptance_tools import EXPORT


class _Rollback(Exception):
    pass


@contextmanager
def open_winner(client: Any, arguments: dict[str, Any], *, commit: bool) -> Iterator[None]:
    """Insert the task for key "k" in another connection; commit or roll back on exit."""
    normalized = EXPORT.normalize_arguments(arguments)
    inserted, finish = threading.Event(), threading.Event()

    def winner() -> None:
        try:
            with transaction.atomic():
                Task.objects.create(
                    client=client,
                    tool_name=EXPORT.name,
                    arguments=normalized,
                    fingerprint=acceptance.fingerprint(EXPORT, normalized),
                    idempotency_key="k",
                )
                inserted.set()
                finish.wait(20)
                if not commit:
                    raise _Rollback
        except _Rollback:
            pass
        finally:
            connection.close()

    thread = threading.Thread(target=winner)
    thread.start()
    assert inserted.wait(10)
    try:
        yield
    finally:
        finish.set()
        thread.join(20)


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except Exception as exc:
            out["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


# A journal (answers of synchronous rounds before escalation) takes the savepoint path on
# PostgreSQL too, instead of the one-statement path: both must decide races the same way.
JOURNALS = [
    pytest.param(None, id="plain"),
    pytest.param([{"seq": 0, "kind": "step", "name": "s", "outcome": 1}], id="with-journal"),
]


def submit(
    client: Any, arguments: dict[str, Any], journal: list[dict[str, Any]] | None = None
) -> acceptance.Receipt:
    return acceptance.accept(
        client=client,
        tool=EXPORT,
        arguments=arguments,
        era=Era.MODERN,
        key=acceptance.IdempotencyKey("k", "header"),
        journal=journal,
    )


def race(  # type: ignore[no-untyped-def]
    client: Any,
    winner_args: dict[str, Any],
    loser_args: dict[str, Any],
    *,
    commit: bool,
    journal: list[dict[str, Any]] | None = None,
):
    with open_winner(client, winner_args, commit=commit):
        thread, out = in_thread(lambda: submit(client, loser_args, journal))
        time.sleep(0.5)
        # Blocked on the winner's uncommitted row (PostgreSQL) or write lock (SQLite).
        assert thread.is_alive(), out
    thread.join(20)
    assert not thread.is_alive()
    return out


@pytest.mark.parametrize("journal", JOURNALS)
def test_a_submission_waits_for_the_winner_and_replays_it(transactional_db, alice, journal) -> None:
    out = race(
        alice, {"quarter": "Q1"}, {"quarter": "Q1", "format": "csv"}, commit=True, journal=journal
    )

    receipt = out["value"]
    winner = Task.objects.get()
    assert (receipt.task.pk, receipt.replayed, receipt.key) == (winner.pk, True, "k")
    assert list(TaskEvent.objects.values_list("kind", flat=True)) == ["duplicate_submission"]


@pytest.mark.parametrize("journal", JOURNALS)
def test_a_submission_creates_its_task_when_the_winner_rolls_back(
    transactional_db, alice, journal
) -> None:
    out = race(alice, {"quarter": "Q1"}, {"quarter": "Q1"}, commit=False, journal=journal)

    receipt = out["value"]
    assert receipt.replayed is False
    assert Task.objects.get().pk == receipt.task.pk
    assert list(TaskEvent.objects.values_list("kind", flat=True)) == ["accepted"]
    assert JournalEntry.objects.filter(task=receipt.task).count() == len(journal or [])


@pytest.mark.parametrize("journal", JOURNALS)
def test_a_racing_submission_with_other_arguments_is_refused(
    transactional_db, alice, journal
) -> None:
    out = race(alice, {"quarter": "Q1"}, {"quarter": "Q2"}, commit=True, journal=journal)

    assert isinstance(out.get("error"), IdempotencyKeyReused), out
    assert Task.objects.count() == 1
    assert TaskEvent.objects.count() == 0


@pytest.mark.parametrize("threads", [8])
def test_concurrent_identical_submissions_make_one_task(transactional_db, alice, threads) -> None:
    start = threading.Barrier(threads)

    def one() -> acceptance.Receipt:
        start.wait(10)
        return submit(alice, {"quarter": "Q1"})

    runs = [in_thread(one) for _ in range(threads)]
    for thread, _ in runs:
        thread.join(30)
    receipts = [out["value"] for _, out in runs]

    task = Task.objects.get()
    assert {r.task.pk for r in receipts} == {task.pk}
    assert sorted(r.replayed for r in receipts) == [False] + [True] * (threads - 1)
    kinds = sorted(TaskEvent.objects.values_list("kind", flat=True))
    assert kinds == ["accepted"] + ["duplicate_submission"] * (threads - 1)
