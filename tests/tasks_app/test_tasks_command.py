"""`manage.py tasks list|show|cancel|settle`: the list's filters from a shell, a tenant's tasks only
when asked, a dry run that changes nothing, cancellations and settled effects in the
timeline."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from tasks_app.models import Effect, EventKind, Status, Task
from tests.tasks_app.console.test_dashboard import make


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("tasks", *args, stdout=out)
    return out.getvalue()


def lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


def test_list_follows_the_filters_and_the_tenant(alice, bob) -> None:
    echo = make(alice)
    make(alice, tool_name="export_report")
    theirs = make(bob)

    assert {r["id"] for r in lines(run("list", "--tool", "slow_echo", "--json"))} == {
        echo.pk,
        theirs.pk,
    }
    only_acme = lines(run("list", "--tool", "slow_echo", "--tenant", "acme", "--json"))
    assert [r["id"] for r in only_acme] == [echo.pk]
    assert only_acme[0]["client"] == "alice" and only_acme[0]["status"] == "working"
    plain = run("list", "--tenant", "globex")
    assert theirs.pk in plain and "slow_echo" in plain and echo.pk not in plain


def test_list_stops_at_its_limit(alice) -> None:
    make(alice, n=7)
    assert len(lines(run("list", "--json", "--limit", "3"))) == 3
    assert len(lines(run("list", "--json", "--limit", "0"))) == 7


def test_a_filter_the_list_would_refuse_is_refused(alice) -> None:
    with pytest.raises(CommandError, match="Unknown status “exploded”"):
        run("list", "--status", "exploded")
    with pytest.raises(CommandError, match="no tenant 'nowhere'"):
        run("list", "--tenant", "nowhere")


def test_show_prints_the_task_its_arguments_and_effects(alice) -> None:
    task = make(alice, arguments={"text": "hi"})
    Effect.objects.create(task=task, seq=1, name="send_notice", target="ops@example.com",
                          downstream_key=f"{task.pk}-1", state="unknown")  # fmt: skip
    shown = json.loads(run("show", task.pk, "--json"))
    assert shown["id"] == task.pk and shown["arguments"] == {"text": "hi"}
    assert shown["effects"] == [
        {"seq": 1, "name": "send_notice", "target": "ops@example.com", "state": "unknown"}
    ]
    assert f"id:               {task.pk}" in run("show", task.pk)
    with pytest.raises(CommandError, match="no task 'missing'"):
        run("show", "missing")


def test_cancel_dry_run_counts_and_changes_nothing(alice, bob) -> None:
    working = make(alice, n=3)
    done = make(alice, status=Status.COMPLETED)
    make(bob)  # globex's: not in acme

    report = json.loads(run("cancel", "--tenant", "acme", "--dry-run", "--json"))

    assert report["dry_run"] is True
    assert (report["matched"], report["cancel_requested"], report["already_ended"]) == (4, 3, 1)
    assert set(report["first"]) == {t.pk for t in working} | {done.pk}
    assert not Task.objects.filter(cancel_requested_at__isnull=False).exists()


def test_cancel_requests_it_of_every_matching_task_and_the_timeline_names_who(alice, bob) -> None:
    mine = make(alice, n=2)
    waiting = make(alice, status=Status.INPUT_REQUIRED)
    other_tool = make(alice, tool_name="export_report")
    theirs = make(bob)

    text = run("cancel", "--tenant", "acme", "--tool", "slow_echo", "--actor", "ops-olga")

    assert text.strip() == "3 tasks matched: requested cancellation of 3, 0 had already ended."
    for task in [*mine, waiting]:
        task.refresh_from_db()
        assert task.cancel_requested_at is not None
        kinds = list(task.events.values_list("kind", "actor_type", "actor"))
        assert (EventKind.CANCEL_REQUESTED, "operator", "ops-olga") in kinds
    assert waiting.status == Status.CANCELLED  # nothing was running: cancelled at once
    for untouched in (other_tool, theirs):
        untouched.refresh_from_db()
        assert untouched.cancel_requested_at is None
    # The same record as the task list's "Cancel all matching", scoped to the tenant.
    from tasks_app.models import BulkAction

    action = BulkAction.objects.get()
    assert (action.from_shell, action.tenant, action.actor, action.done) == (
        True,
        "acme",
        "ops-olga",
        3,
    )
    assert set(action.items.values_list("task_id", flat=True)) == {t.pk for t in [*mine, waiting]}


@pytest.mark.django_db(transaction=True)
def test_the_command_line_says_what_it_does() -> None:
    done = subprocess.run(
        [sys.executable, "manage.py", "tasks", "--help"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "list|show|cancel|settle" in done.stdout


def unknown_effect(task: Task, seq: int = 1, name: str = "send_notice") -> Effect:
    return Effect.objects.create(task=task, seq=seq, name=name, target="ops@example.com",
                                 downstream_key=f"{task.pk}-{seq}", state="unknown")  # fmt: skip


def test_settle_records_the_decision_as_the_page_does(alice) -> None:
    ended = make(alice, status=Status.FAILED)
    first, second = unknown_effect(ended, 1), unknown_effect(ended, 2, name="refund")

    said = run("settle", ended.pk, "send_notice", "--happened", "yes", "--note", "in the outbox",
               "--actor", "ops-olga")  # fmt: skip
    run("settle", ended.pk, "2", "--happened", "no", "--note", "the provider has no refund")

    assert said.strip() == f"Recorded that send_notice (1) of {ended.pk} happened."
    first.refresh_from_db()
    second.refresh_from_db()
    assert (first.state, first.detail["reconciled"]["by"]) == ("confirmed", "ops-olga")
    assert first.detail["reconciled"]["note"] == "in the outbox"
    # No leg will run a finished task again: "did not happen" settles it as failed.
    assert (second.state, second.detail["reconciled"]["by"]) == ("failed", "manage.py")
    kinds = list(ended.events.values_list("kind", "actor"))
    assert (EventKind.EFFECT_RECONCILED, "ops-olga") in kinds
    assert (EventKind.EFFECT_RECONCILED, "manage.py") in kinds
    with pytest.raises(CommandError, match="only an unknown effect can be reconciled"):
        run("settle", ended.pk, "1", "--happened", "no", "--note", "changed my mind")


def test_settle_refuses_what_it_cannot_tell_apart_or_find(alice) -> None:
    task = make(alice, status=Status.COMPLETED)
    unknown_effect(task, 1)
    unknown_effect(task, 2)
    with pytest.raises(
        CommandError, match="2 unknown effects named 'send_notice': give one of 1, 2"
    ):
        run("settle", task.pk, "send_notice", "--happened", "yes", "--note", "checked")
    with pytest.raises(CommandError, match="no effect '7' of task"):
        run("settle", task.pk, "7", "--happened", "yes", "--note", "checked")
    with pytest.raises(CommandError, match="a note is required"):
        run("settle", task.pk, "1", "--happened", "yes", "--note", "  ")
    assert set(Effect.objects.values_list("state", flat=True)) == {"unknown"}


def test_no_task_id_starts_like_an_option() -> None:
    from unittest import mock

    from tasks_app.models import new_task_id

    drawn = iter(["-starts-like-an-option-000000000", "a-fine-id-0000000000000000000000"])
    with mock.patch("tasks_app.models.tasks.secrets.token_urlsafe", lambda n: next(drawn)):
        assert new_task_id() == "a-fine-id-0000000000000000000000"
