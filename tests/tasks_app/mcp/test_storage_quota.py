"""The per-client quota on the bytes of kept tasks (TASKDESK_MAX_STORED_BYTES_PER_CLIENT):
each task counts its arguments, result, error and status message as it is written; over the
quota a new task is refused with 429 storage_quota; the purge frees the room. Run on SQLite
and, with DATABASE_URL set, on PostgreSQL (where acceptance and the end of a leg are single
statements)."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from tasks_app import retention, storage, transitions
from tasks_app.models import Actor, Status, Task
from tasks_app.testing import leg
from tests.tasks_app.mcp.test_quotas import assert_over, submit
from tests.wire import error_of, result_of

pytestmark = pytest.mark.django_db


def _accepted(mcp, key: str, text: str) -> Task:  # type: ignore[no-untyped-def]
    return Task.objects.get(pk=result_of(submit(mcp, key, text=text))["taskId"])


def test_a_task_counts_its_arguments_then_its_result_or_error(mcp, alice, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_MAX_RESULT_BYTES = 2048
    done = _accepted(mcp, "k1", "d" * 1000)
    arguments = storage.json_bytes(done.arguments)
    assert arguments > 1000
    assert done.stored_bytes == arguments

    leg(done)
    assert done.status == Status.COMPLETED
    assert done.stored_bytes == arguments + storage.json_bytes(done.result)

    failed = _accepted(mcp, "k2", "r" * 3000)  # its echo is over the result limit
    leg(failed)
    assert failed.status == Status.FAILED and failed.result is None
    assert failed.stored_bytes == (
        storage.json_bytes(failed.arguments)
        + storage.json_bytes(failed.error)
        + len(failed.status_message.encode())
    )

    cancelled = _accepted(mcp, "k3", "c" * 100)  # ended under the row lock, not by a leg
    transitions.request_cancel(task_id=cancelled.pk, actor_type=Actor.CLIENT, actor="alice")
    cancelled.refresh_from_db()
    assert cancelled.status == Status.CANCELLED
    assert cancelled.stored_bytes == storage.json_bytes(cancelled.arguments)

    assert storage.count(alice.pk) == done.stored_bytes + failed.stored_bytes + (
        cancelled.stored_bytes
    )


def test_over_the_quota_a_new_task_is_refused_until_the_purge_frees_room(
    mcp, bob_mcp, alice, settings
) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_MAX_STORED_BYTES_PER_CLIENT = 5000
    tasks = [_accepted(mcp, f"k{i}", "a" * 2000) for i in range(3)]  # ~2,030 bytes each

    error = assert_over(submit(mcp, "k3"), "storage_quota")
    assert error["data"]["limit"] == 5000
    assert error["data"]["bytes"] == sum(task.stored_bytes for task in tasks)
    assert "TASKDESK_MAX_STORED_BYTES_PER_CLIENT" in error["message"]
    assert not Task.objects.filter(idempotency_key="k3").exists()
    assert_over(submit(mcp, None), "storage_quota")  # keyless alike

    replay = result_of(submit(mcp, "k0", text="a" * 2000))  # stores nothing: never refused
    assert (replay["taskId"], replay["_meta"]["dev.taskdesk/replayed"]) == (tasks[0].pk, True)
    assert error_of(submit(mcp, "k0", text="other"))["data"]["reason"] == "idempotency_key_reused"
    assert result_of(submit(bob_mcp, "k3"))["resultType"] == "task"  # another client's own

    for task in tasks:
        leg(task)
    # Once the recount period has passed, another web process (no memo of its own) counts
    # from the table: the results are included.
    storage._memo.clear()
    storage.forget([alice.pk])
    assert storage.stored_bytes(alice.pk) == sum(task.stored_bytes for task in tasks) > 12_000
    assert_over(submit(mcp, "k3"), "storage_quota")

    with time_machine.travel(timezone.now() + timedelta(days=8, minutes=1)):
        assert retention.purge_expired() == 3
        assert storage.count(alice.pk) == 0
        assert result_of(submit(mcp, "k3"))["resultType"] == "task"


def test_zero_turns_the_storage_quota_off(mcp, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_MAX_STORED_BYTES_PER_CLIENT = 0
    for i in range(3):
        result_of(submit(mcp, f"k{i}", text="a" * 2000))
    assert storage._memo.get(Task.objects.first().client_id) is None  # nothing read


def test_the_figure_is_recounted_after_the_recount_period(
    mcp, alice, settings, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_MAX_STORED_BYTES_PER_CLIENT = 10_000
    monkeypatch.setattr(storage, "MEMO_SECONDS", 0.0)  # every check reads the shared cache
    first = _accepted(mcp, "k1", "a" * 2000)
    # The cached figure was counted before this accept; this process adds its own accepts.
    assert storage.stored_bytes(alice.pk) == first.stored_bytes
    # What another process wrote meanwhile (in the table, not in the cached figure).
    Task.objects.filter(pk=first.pk).update(stored_bytes=20_000)
    assert storage.stored_bytes(alice.pk) == first.stored_bytes
    result_of(submit(mcp, "k2"))  # the slack: accepted on the figure cached earlier
    storage.forget([alice.pk])  # as the recount period running out does
    assert storage.stored_bytes(alice.pk) == storage.count(alice.pk) > 20_000
    assert_over(submit(mcp, "k3"), "storage_quota")
