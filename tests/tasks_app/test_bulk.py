"""Bulk actions: the dry run counts what would happen; the run acts on the same list, in
batches, only on the operator's tenants, names itself in each timeline and keeps a record."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tasks_app import audit, bulk
from tasks_app.clients import client_get_or_create
from tasks_app.listing import TaskFilters
from tasks_app.models import (
    AuditEntry,
    BulkAction,
    BulkActionTask,
    Effect,
    EffectState,
    Status,
    Task,
    TaskEvent,
)
from tasks_app.operators import grant_role


def make(client, n: int = 1, **fields):  # type: ignore[no-untyped-def]
    defaults = {"tool_name": "slow_echo", "arguments": {}}
    return Task.objects.bulk_create(
        [Task(client=client, **{**defaults, **fields}) for _ in range(n)]
    )


def who(user) -> audit.Who:  # type: ignore[no-untyped-def]
    return audit.Who(user, user.get_username(), "192.0.2.1")


def test_the_dry_run_counts_what_would_change_and_changes_nothing(operator, alice) -> None:
    make(alice, 3)
    make(alice, 2, status=Status.COMPLETED)
    make(alice, 1, tool_name="export_report")

    preview = bulk.preview(
        user=operator, kind="cancel", filters=TaskFilters.from_query({"tool": "slow_echo"})
    )

    assert (preview.matched, preview.act, preview.skipped, preview.refused) == (5, 3, 2, 0)
    assert len(preview.first) == 5 and not preview.needs_typed_count
    assert Task.objects.filter(cancel_requested_at__isnull=False).count() == 0


def test_cancel_all_matching_runs_in_batches_and_keeps_a_record(operator, alice, settings) -> None:
    monkey_batch = bulk.BATCH
    bulk.BATCH = 7
    try:
        working = make(alice, 20)
        ended = make(alice, 3, status=Status.FAILED)
        filters = TaskFilters.from_query({"tool": "slow_echo"})
        preview = bulk.preview(user=operator, kind="cancel", filters=filters)
        action = bulk.start(who(operator), kind="cancel", filters=filters, until=preview.until,
                            expected=preview.matched, queue=False)  # fmt: skip

        assert bulk.run(action.pk) is True
    finally:
        bulk.BATCH = monkey_batch

    action.refresh_from_db()
    assert (action.state, action.matched, action.done, action.skipped, action.refused) == (
        "done",
        23,
        20,
        3,
        0,
    )
    assert (
        Task.objects.filter(
            pk__in=[t.pk for t in working], cancel_requested_at__isnull=False
        ).count()
        == 20
    )
    items = dict(BulkActionTask.objects.filter(bulk=action).values_list("task_id", "outcome"))
    assert {items[t.pk] for t in working} == {"done"} and {items[t.pk] for t in ended} == {
        "skipped"
    }
    event = TaskEvent.objects.get(task_id=working[0].pk, kind="cancel_requested")
    assert (event.actor, event.detail["bulk"]) == ("olga", action.pk)
    [entry] = AuditEntry.objects.filter(action="bulk.cancel")
    assert entry.target == f"bulk:{action.pk}" and entry.detail["expected"] == 23
    assert AuditEntry.objects.filter(action="task.cancel").count() == 0  # one entry, not 20


def test_tasks_created_after_the_confirmation_are_left_alone(operator, alice) -> None:
    make(alice, 2)
    filters = TaskFilters.from_query({})
    preview = bulk.preview(user=operator, kind="cancel", filters=filters)
    [late] = make(alice, 1)
    Task.objects.filter(pk=late.pk).update(created_at=preview.until + timedelta(seconds=1))
    action = bulk.start(who(operator), kind="cancel", filters=filters, until=preview.until,
                        expected=2, queue=False)  # fmt: skip

    bulk.run(action.pk)

    late.refresh_from_db()
    assert late.cancel_requested_at is None
    assert BulkAction.objects.get(pk=action.pk).done == 2


def test_another_tenants_tasks_never_match_and_a_viewers_tenant_is_refused(
    operator, alice, bob, django_user_model
) -> None:
    theirs = make(bob, 2)  # globex: olga is no member
    # olga is only a viewer in a third tenant
    carol = client_get_or_create(name="carol", tenant="initech")
    carol.tenant.members.add(operator)
    grant_role(operator, "viewer", carol.tenant)
    watched = make(carol, 2)
    ours = make(alice, 2)
    filters = TaskFilters.from_query({"tool": "slow_echo"})

    preview = bulk.preview(user=operator, kind="cancel", filters=filters)
    action = bulk.start(who(operator), kind="cancel", filters=filters, until=preview.until,
                        expected=preview.matched, queue=False)  # fmt: skip
    bulk.run(action.pk)

    assert (preview.matched, preview.act, preview.refused) == (4, 2, 2)
    touched = set(BulkActionTask.objects.values_list("task_id", flat=True))
    assert touched == {t.pk for t in ours + watched}
    assert not Task.objects.filter(pk__in=[t.pk for t in theirs + watched],
                                   cancel_requested_at__isnull=False).exists()  # fmt: skip


def test_a_role_without_the_permission_may_not_start_one(viewer) -> None:
    assert not bulk.may(viewer, "cancel") and not bulk.may(viewer, "settle")


def test_settle_all_matching_records_the_same_decision_for_every_unknown_effect(
    operator, alice
) -> None:
    tasks = make(alice, 3, tool_name="send_notice")
    for task in tasks:
        Effect.objects.create(task=task, seq=1, name="send_notice", state=EffectState.UNKNOWN,
                              downstream_key=f"{task.pk}:1")  # fmt: skip
    filters = TaskFilters.from_query({"outcome": "unknown_effect"})
    with pytest.raises(bulk.NotApplicable):
        bulk.preview(user=operator, kind="settle", filters=TaskFilters.from_query({}))

    preview = bulk.preview(user=operator, kind="settle", filters=filters)
    action = bulk.start(who(operator), kind="settle", filters=filters, until=preview.until,
                        expected=preview.matched, happened=True, note="In the mail log.",
                        queue=False)  # fmt: skip
    bulk.run(action.pk)

    assert preview.act == 3
    assert set(Effect.objects.values_list("state", flat=True)) == {EffectState.CONFIRMED}
    event = TaskEvent.objects.filter(kind="effect_reconciled").first()
    assert event is not None and event.detail["bulk"] == action.pk
    assert event.detail["note"] == "In the mail log." and event.actor == "olga"


def test_a_run_cut_short_goes_on_where_it_stopped(operator, alice) -> None:
    saved = bulk.BATCH
    bulk.BATCH = 5
    try:
        make(alice, 12)
        filters = TaskFilters.from_query({})
        preview = bulk.preview(user=operator, kind="cancel", filters=filters)
        action = bulk.start(who(operator), kind="cancel", filters=filters, until=preview.until,
                            expected=12, queue=False)  # fmt: skip
        assert bulk.run(action.pk, seconds=0) is False  # one batch, then it hands on
        assert BulkAction.objects.get(pk=action.pk).done == 5
        assert bulk.run(action.pk) is True
    finally:
        bulk.BATCH = saved
    action.refresh_from_db()
    assert (action.done, action.state) == (12, "done")
    assert BulkActionTask.objects.filter(bulk=action).count() == 12


def test_a_stalled_job_is_queued_again(operator, alice, monkeypatch) -> None:
    queued: list[int] = []
    monkeypatch.setattr(bulk, "enqueue", queued.append)
    filters = TaskFilters.from_query({})
    action = bulk.start(who(operator), kind="cancel", filters=filters, until=timezone.now(),
                        expected=0, queue=False)  # fmt: skip
    BulkAction.objects.filter(pk=action.pk).update(touched_at=timezone.now() - timedelta(hours=1))

    assert bulk.revive_stalled() == 1
    assert queued == [action.pk]
    assert bulk.revive_stalled() == 0  # touched now: not again at once


def test_an_operator_who_no_longer_exists_fails_the_job(operator, alice) -> None:
    make(alice, 1)
    action = bulk.start(who(operator), kind="cancel", filters=TaskFilters.from_query({}),
                        until=timezone.now(), expected=1, queue=False)  # fmt: skip
    operator.is_active = False
    operator.save()

    assert bulk.run(action.pk) is True
    action.refresh_from_db()
    assert action.state == "failed" and "no longer exists" in action.error
    assert not Task.objects.filter(cancel_requested_at__isnull=False).exists()


def test_a_list_past_the_limit_is_refused_before_anything_runs(
    operator, alice, monkeypatch
) -> None:
    monkeypatch.setattr(bulk, "MAX_TASKS", 3)
    make(alice, 4)

    with pytest.raises(bulk.TooMany, match=r"More than 3 tasks match: narrow the filter\."):
        bulk.preview(user=operator, kind="cancel", filters=TaskFilters.from_query({}))
    assert not BulkAction.objects.exists()
