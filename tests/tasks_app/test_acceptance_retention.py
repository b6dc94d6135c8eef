"""How long a task and its idempotency key live, and the purge that ends them; and waiting
for a task's outcome."""

from __future__ import annotations

import csv
import io
import json
import threading
import time
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
import time_machine
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from elicitations.models import InputRequest
from tasks_app import acceptance, retention, selectors, transitions
from tasks_app.models import (
    Dispatch,
    Effect,
    EffectState,
    Era,
    JournalEntry,
    PurgedTask,
    Status,
    Task,
    TaskEvent,
)
from tasks_app.selectors import TaskNotFound
from tasks_app.tasks import purge_expired_job
from tests.tasks_app.acceptance_tools import ECHO

DAY = timedelta(days=1)
ECHO_GLOBAL_TTL = replace(ECHO, ttl=None)  # kept for TASKDESK_TASK_TTL_SECONDS


@pytest.fixture(autouse=True)
def _window(settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_TASK_TTL_SECONDS = 7 * 24 * 3600
    settings.TASKDESK_PURGE_GRACE_SECONDS = 24 * 3600


def submit(client: Any, key: str | None = "k-1", text: str = "hi") -> acceptance.Receipt:
    return acceptance.accept(
        client=client,
        tool=ECHO_GLOBAL_TTL,
        arguments={"text": text},
        era=Era.MODERN,
        key=acceptance.IdempotencyKey(key, "header") if key else None,
    )


def finished(client: Any, key: str | None = "k-1") -> Task:
    task = submit(client, key).task
    return transitions.complete(task_id=task.pk, result={"content": [], "isError": False})


def with_records(task: Task) -> Task:
    """Give TASK a journal entry, an effect and an input request, as a real run would."""
    JournalEntry.objects.create(task=task, seq=0, kind="step", name="s", outcome=1)
    Effect.objects.create(
        task=task,
        seq=1,
        name="write",
        downstream_key=f"{task.pk}:write:1",
        state=EffectState.CONFIRMED,
    )
    InputRequest.objects.create(task=task, key=f"{task.pk}:q", ask_key="q", message="?")
    return task


def test_expiry_is_ttl_plus_grace() -> None:
    assert retention.expiry_for(None) is None
    assert retention.expiry_for(60_000) == timedelta(minutes=1) + DAY


def test_a_task_is_kept_for_its_ttl_plus_the_grace_period(alice) -> None:
    task = submit(alice).task
    assert task.ttl_ms == 7 * 24 * 3600 * 1000
    assert abs(task.expires_at - (task.created_at + 8 * DAY)) < timedelta(seconds=1)


def test_a_tools_own_ttl_sets_its_window(alice) -> None:
    task = acceptance.accept(
        client=alice, tool=ECHO, arguments={"text": "hi"}, era=Era.MODERN
    ).task  # ECHO's ttl is one hour
    assert abs(task.expires_at - (task.created_at + timedelta(hours=1) + DAY)) < timedelta(
        seconds=1
    )


def test_the_key_replays_until_the_task_is_purged_then_starts_a_new_task(alice) -> None:
    first = with_records(finished(alice))
    keep = finished(alice, key="k-keep")
    Task.objects.filter(pk=keep.pk).update(expires_at=timezone.now() + 10 * DAY)

    with time_machine.travel(timezone.now() + 8 * DAY - timedelta(minutes=1)):
        assert retention.purge_expired() == 0
        assert submit(alice).task.pk == first.pk

    with time_machine.travel(timezone.now() + 8 * DAY + timedelta(minutes=1)):
        assert retention.purge_expired() == 1
        assert not Task.objects.filter(pk=first.pk).exists()
        for model in (TaskEvent, JournalEntry, Effect, Dispatch, InputRequest):
            assert not model.objects.filter(task_id=first.pk).exists(), model.__name__
        assert Task.objects.filter(pk=keep.pk).exists()

        again = submit(alice)
    assert again.replayed is False
    assert again.task.pk != first.pk


def test_a_task_still_running_at_its_purge_moment_fails_and_is_kept_one_more_grace(
    alice,
) -> None:
    task = submit(alice).task
    waiting = submit(alice, key="k-2").task
    transitions.require_input(task_id=waiting.pk, message="which one?")
    later = timezone.now() + 8 * DAY + timedelta(minutes=1)

    with time_machine.travel(later):
        assert retention.purge_expired() == 0

    for expired in (Task.objects.get(pk=task.pk), Task.objects.get(pk=waiting.pk)):
        assert expired.status == Status.FAILED
        assert expired.error == {
            "code": -32603,
            "message": "The task expired: it did not finish within its time to live.",
        }
        assert expired.expires_at == later + DAY
        kinds = list(expired.events.values_list("kind", flat=True))
        assert kinds[-2:] == ["failed", "expired"]
    # Its key still answers with the outcome during the extra grace period.
    assert submit(alice).task.status == Status.FAILED

    with time_machine.travel(later + DAY + timedelta(minutes=1)):
        assert purge_expired_job() == 2
    assert Task.objects.count() == 0


def test_purge_deletes_in_batches(alice) -> None:
    for i in range(5):
        finished(alice, key=f"k-{i}")
    with time_machine.travel(timezone.now() + 9 * DAY):
        assert retention.purge_expired(batch=2) == 5
    assert Task.objects.count() == 0


# --- retention never undoes idempotency, and leaves an archive ---------------------------


def with_effect(task: Task, state: str) -> Effect:
    return Effect.objects.create(
        task=task, seq=0, name="charge", downstream_key=f"{task.pk}:charge:0", state=state
    )


@pytest.mark.parametrize("state", [EffectState.INTENDED, EffectState.UNKNOWN])
def test_a_task_with_an_unsettled_effect_is_kept_and_its_key_stays_reserved(
    alice, operator, state: str
) -> None:
    from tasks_app import runtime

    task = finished(alice)
    with_effect(task, state)
    later = timezone.now() + 9 * DAY

    with time_machine.travel(later):
        assert purge_expired_job() == 0
        assert submit(alice).task.pk == task.pk  # a retry finds the task: nothing runs again
        assert list(retention.held_back()) == [task]
    effect = Effect.objects.get(task=task)
    # An intent left on a finished task becomes unknown, so that an operator can reconcile it.
    assert effect.state == EffectState.UNKNOWN
    assert not PurgedTask.objects.exists()

    runtime.reconcile_effect(effect_id=effect.pk, happened=False, user=operator)
    effect.refresh_from_db()
    assert effect.state == EffectState.FAILED  # no leg will run it again: it did not happen

    with time_machine.travel(later + timedelta(minutes=5)):
        assert purge_expired_job() == 1
        assert submit(alice).task.pk != task.pk
    assert PurgedTask.objects.get().task_id == task.pk


def test_every_purged_task_leaves_an_archive_line_that_can_be_exported(
    alice, tmp_path, capsys
) -> None:
    ok = finished(alice, key="k-ok")
    tool_error = submit(alice, key="k-err").task
    transitions.complete(task_id=tool_error.pk, result={"content": [], "isError": True})
    keyless = submit(alice, key=None).task
    transitions.fail(task_id=keyless.pk, error={"code": -32603, "message": "boom"})
    purged_at = timezone.now() + 9 * DAY

    with time_machine.travel(purged_at, tick=False):
        assert retention.purge_expired() == 3

    lines = {row.task_id: row for row in PurgedTask.objects.all()}
    assert set(lines) == {ok.pk, tool_error.pk, keyless.pk}
    assert (lines[ok.pk].idempotency_key, lines[ok.pk].client_name) == ("k-ok", "alice")
    assert lines[ok.pk].outcome == "completed"
    assert lines[tool_error.pk].outcome == "completed_with_error"
    assert (lines[keyless.pk].idempotency_key, lines[keyless.pk].outcome) == (None, "failed")
    assert all(line.purged_at == purged_at for line in lines.values())

    call_command("export_purged_tasks")
    exported = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert {row["task_id"]: row["outcome"] for row in exported} == {
        ok.pk: "completed",
        tool_error.pk: "completed_with_error",
        keyless.pk: "failed",
    }
    assert {row["idempotency_key"] for row in exported} == {"k-ok", "k-err", ""}
    assert {row["client"] for row in exported} == {"alice"}

    out = tmp_path / "purged.jsonl"
    call_command("export_purged_tasks", format="jsonl", output=str(out), since="2000-01-01")
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["task_id"] for r in records) == sorted(lines)
    call_command("export_purged_tasks", format="jsonl", client="nobody")
    assert capsys.readouterr().out == ""
    with pytest.raises(CommandError, match="--since must be an ISO 8601 time"):
        call_command("export_purged_tasks", since="yesterday")


# --- waiting for the outcome -----------------------------------------------------------


def test_wait_for_outcome_returns_once_the_task_is_terminal(transactional_db, alice) -> None:
    task = submit(alice).task

    def finish() -> None:
        time.sleep(0.3)
        transitions.complete(task_id=task.pk, result={"content": [], "isError": False})
        connection.close()

    threading.Thread(target=finish).start()
    started = time.monotonic()
    outcome = selectors.wait_for_outcome(task.pk, timeout=10)
    assert outcome.status == Status.COMPLETED
    assert time.monotonic() - started < 2


def test_wait_for_outcome_gives_up_after_the_timeout(db, alice) -> None:
    task = submit(alice).task
    started = time.monotonic()
    outcome = selectors.wait_for_outcome(task.pk, timeout=0.3)
    assert outcome.status == Status.WORKING
    assert 0.3 <= time.monotonic() - started < 1


def test_wait_for_outcome_of_a_missing_task_raises(db) -> None:
    with pytest.raises(TaskNotFound):
        selectors.wait_for_outcome("no-such-task", timeout=1)
