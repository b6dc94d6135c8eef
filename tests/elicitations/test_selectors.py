"""Which questions an operator may see: their tenants' (superusers: all), inbox kinds only."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.contrib.auth.models import AnonymousUser
from django.utils import timezone

from elicitations import selectors, transitions
from tasks_app import transitions as task_transitions
from tasks_app.models import Task


@pytest.fixture
def bobs_task(bob):  # type: ignore[no-untyped-def]
    return Task.objects.create(client=bob, tool_name="refund_payment", arguments={})


def ids(qs) -> list[int]:  # type: ignore[no-untyped-def]
    return [r.pk for r in qs]


def test_an_operator_sees_pending_operator_questions_of_their_tenant(
    ask, operator, bobs_task
) -> None:
    mine = ask(audience="operator")
    either = ask(audience="any", ask_key="either")
    ask(audience="client", ask_key="client-only")
    ask(audience="client", mode="url", schema=None, url="https://pay.example/x", ask_key="u")
    transitions.open_request(task=bobs_task, ask_key="a", message="globex's", audience="operator")

    assert sorted(ids(selectors.inbox_for(user=operator))) == sorted([mine.pk, either.pk])
    assert selectors.inbox_count(user=operator) == 2


def test_an_outsider_and_an_anonymous_visitor_see_nothing(ask, outsider) -> None:
    ask()
    assert ids(selectors.inbox_for(user=outsider)) == []
    assert ids(selectors.inbox_for(user=AnonymousUser())) == []


def test_an_inactive_operator_sees_nothing(ask, operator) -> None:
    ask()
    operator.is_active = False
    assert ids(selectors.inbox_for(user=operator)) == []


def test_a_superuser_sees_every_tenant(ask, bobs_task, django_user_model) -> None:
    root = django_user_model.objects.create_superuser(username="root", password="pw-root-123")
    mine = ask()
    theirs = transitions.open_request(
        task=bobs_task, ask_key="a", message="globex's", audience="operator"
    )
    assert sorted(ids(selectors.inbox_for(user=root))) == sorted([mine.pk, theirs.pk])


def test_answered_questions_and_ended_tasks_leave_the_inbox(ask, task, operator, alice) -> None:
    answered = ask(ask_key="answered")
    ask(ask_key="waiting")
    transitions.answer(
        task=task, key=answered.key, response={"action": "decline"}, channel="inbox", user=operator
    )
    assert len(ids(selectors.inbox_for(user=operator))) == 1

    other = Task.objects.create(client=alice, tool_name="slow_echo", arguments={})
    transitions.open_request(task=other, ask_key="x", message="?", audience="operator")
    # A finished task's requests are closed by the task transition; the inbox also
    # refuses to list questions of a terminal task even if one were left pending.
    Task.objects.filter(pk=other.pk).update(status="completed")
    assert len(ids(selectors.inbox_for(user=operator))) == 1

    task_transitions.fail(task_id=task.pk, error={"code": -32603, "message": "x"})
    assert ids(selectors.inbox_for(user=operator)) == []


def test_most_urgent_deadline_first_and_no_deadline_last(ask, operator) -> None:
    now = timezone.now()
    none = ask(ask_key="none")
    later = ask(ask_key="later", deadline=now + timedelta(hours=2))
    soon = ask(ask_key="soon", deadline=now + timedelta(minutes=5))
    none2 = ask(ask_key="none2")
    assert ids(selectors.inbox_for(user=operator)) == [soon.pk, later.pk, none.pk, none2.pk]


def test_get_for_operator_hides_other_tenants_and_client_questions(
    ask, operator, outsider, bobs_task
) -> None:
    theirs = transitions.open_request(
        task=bobs_task, ask_key="a", message="globex's", audience="operator"
    )
    client_only = ask(audience="client")
    mine = ask()
    assert selectors.input_request_get_for_operator(user=operator, request_id=mine.pk) == mine
    for user, request_id in [
        (operator, theirs.pk),
        (operator, client_only.pk),
        (outsider, mine.pk),
        (operator, 999_999),
    ]:
        with pytest.raises(selectors.InputRequestNotFound):
            selectors.input_request_get_for_operator(user=user, request_id=request_id)


def test_get_for_operator_returns_answered_questions_too(ask, task, operator) -> None:
    mine = ask()
    transitions.answer(
        task=task, key=mine.key, response={"action": "decline"}, channel="inbox", user=operator
    )
    got = selectors.input_request_get_for_operator(user=operator, request_id=mine.pk)
    assert (got.status, got.answered_by) == ("declined", "olga")


def test_the_inbox_version_changes_with_the_list_and_each_minute(ask, operator) -> None:
    first = ask(ask_key="one")
    with time_machine.travel("2026-11-29 10:00:05Z", tick=False) as clock:
        before = selectors.inbox_version([first])
        assert selectors.inbox_version([first]) == before
        assert selectors.inbox_version([first, ask(ask_key="two")]) != before
        assert selectors.inbox_version([]) != before
        clock.shift(timedelta(minutes=1))  # ages shown in the list move on
        assert selectors.inbox_version([first]) != before
