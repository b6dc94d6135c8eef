"""routing.route: who answers a question, given what the task's client declared."""

from __future__ import annotations

import pytest

from elicitations.routing import Route, route
from tasks_app.tools import MissingClientCapability, ProtocolError

TASKS = "io.modelcontextprotocol/tasks"


def test_an_operator_question_goes_to_the_operators_whatever_the_client_declared() -> None:
    for declared in (None, "", "form", "form url", "no-tasks"):
        for mode in ("form", "url"):
            assert route(
                ask_key="q", mode=mode, audience="operator", client_answers=declared
            ) == Route("operator")


@pytest.mark.parametrize("audience", ["client", "any"])
def test_a_task_whose_client_declarations_were_not_recorded_is_routed_as_asked(audience) -> None:
    for mode in ("form", "url"):
        assert route(ask_key="q", mode=mode, audience=audience, client_answers=None) == Route(
            audience
        )


@pytest.mark.parametrize(
    ("mode", "declared"),
    [("form", "form"), ("form", "form url"), ("url", "url"), ("url", "form url")],
)
@pytest.mark.parametrize("audience", ["client", "any"])
def test_a_client_that_declared_the_mode_is_asked_as_the_tool_says(
    mode, declared, audience
) -> None:
    assert route(ask_key="q", mode=mode, audience=audience, client_answers=declared) == Route(
        audience
    )


def test_a_client_question_the_client_cannot_answer_cannot_be_asked() -> None:
    with pytest.raises(MissingClientCapability) as raised:
        route(ask_key="confirm", mode="form", audience="client", client_answers="")

    assert isinstance(raised.value, ProtocolError)
    assert str(raised.value) == (
        "Question 'confirm' cannot be asked: the client declared no elicitation capability "
        "(form mode); this question can only be answered by the client"
    )
    assert raised.value.code == -32021
    assert raised.value.data == {
        "requiredCapabilities": {"elicitation": {"form": {}}},
        "reason": "client_cannot_answer",
        "question": "confirm",
    }


def test_a_client_that_declared_another_mode_is_told_which_mode_is_missing() -> None:
    with pytest.raises(MissingClientCapability) as raised:
        route(ask_key="login", mode="url", audience="client", client_answers="form")

    assert str(raised.value) == (
        "Question 'login' cannot be asked: the client declared elicitation without url mode; "
        "this question can only be answered by the client"
    )
    assert raised.value.required == {"elicitation": {"url": {}}}


@pytest.mark.parametrize("declared", ["", "url"])
def test_a_form_question_operators_may_answer_goes_to_the_operators(declared) -> None:
    routed = route(ask_key="ok", mode="form", audience="any", client_answers=declared)

    assert routed.audience == "operator"
    what = "no elicitation capability (form mode)" if not declared else "elicitation without form"
    assert routed.why.startswith(f"the client declared {what}")


def test_a_url_question_is_never_passed_to_the_operators() -> None:
    with pytest.raises(MissingClientCapability) as raised:
        route(ask_key="consent", mode="url", audience="any", client_answers="form")

    assert str(raised.value) == (
        "Question 'consent' cannot be asked: the client declared elicitation without url mode; "
        "this question can only be answered by the client (operators do not answer URL-mode "
        "questions)"
    )


def test_a_2026_call_without_the_tasks_extension_cannot_answer_a_task_question() -> None:
    with pytest.raises(MissingClientCapability) as raised:
        route(ask_key="ok", mode="form", audience="client", client_answers="form url no-tasks")

    assert str(raised.value) == (
        f"Question 'ok' cannot be asked: its call did not declare the {TASKS} extension, "
        "through which a task's questions are answered (tasks/update); this question can only "
        "be answered by the client"
    )
    assert raised.value.required == {"extensions": {TASKS: {}}}


def test_without_elicitation_or_the_tasks_extension_both_are_named() -> None:
    with pytest.raises(MissingClientCapability) as raised:
        route(ask_key="ok", mode="form", audience="client", client_answers="no-tasks")

    assert raised.value.required == {"elicitation": {"form": {}}, "extensions": {TASKS: {}}}
    assert "no elicitation capability (form mode); its call did not declare" in str(raised.value)
    routed = route(ask_key="ok", mode="form", audience="any", client_answers="no-tasks")
    assert routed.audience == "operator"
