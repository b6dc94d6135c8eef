"""The dashboard's attention list and its count (``selectors.attention_filter``), for
questions: one past its deadline is on it until the deadline job has settled it."""

from __future__ import annotations

from datetime import UTC, datetime

import time_machine

from elicitations import transitions as questions
from elicitations.selectors import overdue_task_ids
from tasks_app import listing, selectors
from tasks_app.listing import TaskFilters
from tasks_app.models import Status, Task

ASKED = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)


def needing_attention(user) -> tuple[set[str], int]:  # type: ignore[no-untyped-def]
    """The ids on USER's attention list, and its count, as the dashboard computes them."""
    attention = selectors.attention_filter(overdue_task_ids=overdue_task_ids())
    filters = TaskFilters(attention=True)
    page = listing.task_page_for_operator(user=user, filters=filters, attention=attention)
    count = listing.attention_count_for_operator(user=user, filters=filters, attention=attention)
    return {task.pk for task in page.tasks}, count.value


def ask(task: Task, **options) -> None:  # type: ignore[no-untyped-def]
    questions.open_request(
        task=task, ask_key="approve", message="Approve?", audience="operator", **options
    )


def test_a_question_past_its_default_deadline_needs_attention_until_it_is_settled(
    operator, alice, settings
) -> None:
    settings.TASKDESK_QUESTION_DEADLINE_SECONDS = 3600
    declined = Task.objects.create(client=alice, tool_name="refund_payment")
    failed = Task.objects.create(client=alice, tool_name="refund_payment")
    with time_machine.travel(ASKED, tick=False) as clock:
        ask(declined)  # no deadline given: the default one, an hour
        ask(failed, on_timeout="fail")
        clock.shift(3599)
        assert needing_attention(operator) == (set(), 0)

        clock.shift(1)  # at the deadline: due, as the deadline job counts it

        assert needing_attention(operator) == ({declined.pk, failed.pk}, 2)
        assert questions.expire_overdue() == 2
        # Declined: the task resumes and leaves the list. Failed: it stays, as a failure.
        assert needing_attention(operator) == ({failed.pk}, 1)
        failed.refresh_from_db()
        assert failed.status == Status.FAILED


def test_an_overdue_question_of_another_tenant_is_not_on_the_list(operator, bob) -> None:
    theirs = Task.objects.create(client=bob, tool_name="refund_payment")
    with time_machine.travel(ASKED, tick=False) as clock:
        ask(theirs)
        clock.shift(25 * 3600)

        assert overdue_task_ids() == [theirs.pk]
        assert needing_attention(operator) == (set(), 0)
