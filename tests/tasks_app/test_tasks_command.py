"""`manage.py tasks list|show|cancel`: the list's filters from a shell, a tenant's tasks only
when asked, a dry run that changes nothing, cancellations in the timeline."""

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
        {"name": "send_notice", "target": "ops@example.com", "state": "unknown"}
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


@pytest.mark.django_db(transaction=True)
def test_the_command_line_says_what_it_does() -> None:
    done = subprocess.run(
        [sys.executable, "manage.py", "tasks", "--help"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "list|show|cancel" in done.stdout
