"""transitions.open_request: a tool asks a question."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.utils import timezone

from elicitations import transitions
from elicitations.models import InputRequest
from elicitations.schemas import UnsupportedSchema
from tasks_app import transitions as task_transitions
from tasks_app.models import TaskEvent


def test_it_records_a_pending_request_and_an_event(task, ask) -> None:
    deadline = datetime(2030, 1, 1, tzinfo=UTC)
    request = ask(deadline=deadline, on_timeout="fail")

    row = InputRequest.objects.get(pk=request.pk)
    assert row.status == "pending"
    assert row.ask_key == "approval"
    assert row.audience == "operator"
    assert row.deadline == deadline
    assert row.on_timeout == "fail"
    assert row.key.startswith(f"{task.pk}:")
    assert len(row.key.split(":")[1]) == 16
    ev = TaskEvent.objects.get(task=task, kind="input_requested")
    assert ev.detail == {
        "key": row.key,
        "ask_key": "approval",
        "mode": "form",
        "audience": "operator",
        "deadline": "2030-01-01T00:00:00+00:00",
        "on_timeout": "fail",
    }


def test_keys_are_never_reused_within_a_task(ask) -> None:
    keys = {ask(ask_key=f"q{i}").key for i in range(50)}
    assert len(keys) == 50


def test_a_question_without_schema_is_an_empty_form(ask) -> None:
    assert ask(schema=None).requested_schema == {"type": "object", "properties": {}}


def test_a_timedelta_deadline_counts_from_now(ask) -> None:
    before = timezone.now()
    request = ask(deadline=timedelta(minutes=5))
    assert (
        before + timedelta(minutes=5) <= request.deadline <= timezone.now() + timedelta(minutes=5)
    )


def test_it_refuses_a_schema_outside_the_subset_and_records_nothing(task, ask) -> None:
    nested = {"type": "object", "properties": {"a": {"type": "object"}}}
    with pytest.raises(UnsupportedSchema, match="property 'a': nested objects are not allowed"):
        ask(schema=nested)
    assert not InputRequest.objects.exists()
    assert not TaskEvent.objects.filter(task=task).exists()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"mode": "sms"}, "mode must be form or url, not 'sms'"),
        ({"audience": "everyone"}, "audience must be client, operator or any, not 'everyone'"),
        ({"on_timeout": "retry"}, "on_timeout must be decline, default or fail, not 'retry'"),
        ({"on_timeout": "default"}, 'on_timeout="default" needs a default answer'),
        (
            {"on_timeout": "default", "default": {"approve": "maybe"}},
            "the default answer does not fit the schema: approve: must be true or false",
        ),
        ({"url": "https://example.com/"}, "a form-mode question has a schema, not a url"),
        (
            {"mode": "url", "schema": None, "url": "javascript:alert(1)", "audience": "client"},
            "a URL-mode question needs an http(s) url, not 'javascript:alert(1)'",
        ),
        (
            {"mode": "url", "schema": None, "url": "https://example.com/"},
            "a URL-mode question can only be asked of the client",
        ),
        (
            {"mode": "url", "url": "https://example.com/", "audience": "client"},
            "a URL-mode question has a url, not a schema",
        ),
        (
            {"deadline": datetime(2030, 1, 1)},  # noqa: DTZ001 - the naive value under test
            "deadline must be a timezone-aware datetime or a timedelta",
        ),
    ],
)
def test_it_refuses_inconsistent_questions(ask, options, message) -> None:
    with pytest.raises(UnsupportedSchema) as info:
        ask(**options)
    assert str(info.value) == message


def test_a_url_question_for_the_client(ask) -> None:
    request = ask(mode="url", schema=None, url="https://pay.example.com/c/1", audience="client")
    assert request.mode == "url"
    assert request.requested_schema is None


def test_it_keeps_a_default_answer_only_for_the_default_policy(ask) -> None:
    assert ask(on_timeout="default", default={"approve": False}).default_answer == {
        "approve": False
    }
    assert ask(default={"approve": False}).default_answer is None


def test_an_ended_task_cannot_ask(task, ask) -> None:
    task_transitions.fail(task_id=task.pk, error={"code": -32603, "message": "boom"})
    with pytest.raises(transitions.TaskClosed, match="is failed; it cannot ask 'approval'"):
        ask()
    assert not InputRequest.objects.exists()


def test_forms_keep_the_order_the_tool_wrote_the_properties_in(ask) -> None:
    from tests.elicitations.test_schemas import EVERY_FIELD_KIND

    request = InputRequest.objects.get(pk=ask(schema=EVERY_FIELD_KIND).pk)
    written = list(EVERY_FIELD_KIND["properties"])
    assert request.property_order == written
    # PostgreSQL's jsonb returns object keys in its own order; the form does not follow it.
    assert list(request.form_schema["properties"]) == written
    request.requested_schema["properties"] = dict(
        reversed(request.requested_schema["properties"].items())
    )
    assert list(request.form_schema["properties"]) == written


# --- the default deadline ---------------------------------------------------------------------


def test_a_question_without_a_deadline_gets_the_default_one(task, ask, settings) -> None:
    settings.TASKDESK_QUESTION_DEADLINE_SECONDS = 3600
    with time_machine.travel("2026-11-29 10:00:00Z", tick=False):
        request = ask(deadline=None)

    assert request.deadline == datetime(2026, 11, 29, 11, 0, tzinfo=UTC)
    event = TaskEvent.objects.get(task=task, kind="input_requested")
    assert event.detail["deadline"] == "2026-11-29T11:00:00+00:00"


# --- a client that cannot answer ----------------------------------------------------------------


def _client_declared(task, client_answers: str | None) -> None:  # type: ignore[no-untyped-def]
    type(task).objects.filter(pk=task.pk).update(client_answers=client_answers)


def test_a_question_the_client_cannot_answer_goes_to_the_operators_when_they_may(
    task, ask, operator
) -> None:
    from elicitations import selectors

    _client_declared(task, "")

    request = ask(audience="any")

    assert request.audience == "operator"
    assert list(selectors.inbox_for(user=operator)) == [request]
    event = TaskEvent.objects.get(task=task, kind="input_requested")
    assert event.detail["audience"] == "operator"
    assert event.detail["asked_audience"] == "any"
    assert event.detail["client_cannot_answer"] == (
        "the client declared no elicitation capability (form mode)"
    )


def test_a_question_only_the_client_may_answer_is_not_asked(task, ask) -> None:
    from tasks_app.tools import MissingClientCapability

    _client_declared(task, "url")

    with pytest.raises(MissingClientCapability, match="declared elicitation without form mode"):
        ask(audience="client")

    assert not InputRequest.objects.exists()
    assert not TaskEvent.objects.filter(task=task).exists()


def test_a_client_that_declared_the_mode_is_asked_as_the_tool_says(task, ask) -> None:
    _client_declared(task, "form")

    assert ask(audience="any").audience == "any"
    assert ask(audience="client", ask_key="c").audience == "client"
    assert "client_cannot_answer" not in TaskEvent.objects.filter(kind="input_requested")[0].detail
