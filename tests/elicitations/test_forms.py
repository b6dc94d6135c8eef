"""Form fields built from a question's schema: a decision the schema leaves open is one the
answerer makes, never one a pre-ticked or silently empty input makes for them."""

from __future__ import annotations

import re
from typing import Any

from django import forms

from elicitations.forms import AnswerForm, answer_summary, field_for
from elicitations.schemas import check_form_schema
from tasks_app.tools.toolsets.demo.tools import APPROVAL_FORM

YES_NO = [("true", "Yes"), ("false", "No")]
DECISION = {
    "type": "string",
    "title": "Decision",
    "oneOf": [{"const": "approve", "title": "Approve"}, {"const": "decline", "title": "Decline"}],
}


def form(
    schema_properties: dict[str, Any], required: list[str], data: dict[str, Any]
) -> AnswerForm:
    schema = {"type": "object", "properties": schema_properties, "required": required}
    check_form_schema(schema)
    return AnswerForm(schema, data=data)


def test_a_required_boolean_without_a_default_is_a_yes_or_no_choice_with_none_made() -> None:
    field = field_for({"type": "boolean", "title": "Ship it"}, name="ship", required=True)

    assert isinstance(field.widget, forms.RadioSelect)
    assert field.required is True
    assert list(field.choices) == YES_NO  # no "(no answer)": one of the two must be chosen
    assert field.initial is None
    html = str(AnswerForm({"type": "object", "properties": {"ship": {"type": "boolean"}},
                           "required": ["ship"]})["ship"])  # fmt: skip
    assert "checked" not in html
    assert (
        len(re.findall(r'<input type="radio" name="ship" value="(?:true|false)" required', html))
        == 2
    )


def test_an_unchosen_required_boolean_is_refused_with_a_clear_message() -> None:
    refused = form({"ship": {"type": "boolean"}}, ["ship"], {})
    assert not refused.is_valid()
    assert refused.errors == {"ship": ["Choose Yes or No."]}
    # "on" is what a checkbox sends; it is not an answer to a yes-or-no question.
    assert not form({"ship": {"type": "boolean"}}, ["ship"], {"ship": "on"}).is_valid()


def test_yes_and_no_answer_true_and_false() -> None:
    for sent, typed in (("true", True), ("false", False)):
        answered = form({"ship": {"type": "boolean"}}, ["ship"], {"ship": sent})
        assert answered.is_valid(), answered.errors
        assert answered.content() == {"ship": typed}


def test_an_optional_boolean_without_a_default_starts_at_no_answer_and_may_stay_there() -> None:
    field = field_for({"type": "boolean"}, name="rush", required=False)
    assert isinstance(field.widget, forms.RadioSelect)
    assert list(field.choices) == [("", "(no answer)"), *YES_NO]
    html = str(AnswerForm({"type": "object", "properties": {"rush": {"type": "boolean"}}})["rush"])
    assert re.search(r'<input type="radio" name="rush" value="" id="id_rush_0" checked>', html)

    left = form({"rush": {"type": "boolean"}}, [], {"rush": ""})
    assert left.is_valid() and left.content() == {}


def test_a_boolean_with_a_default_keeps_it() -> None:
    for default in (True, False):
        prop = {"type": "boolean", "title": "Notify", "default": default}
        field = field_for(prop, name="notify", required=True)
        assert isinstance(field, forms.BooleanField)
        assert isinstance(field.widget, forms.CheckboxInput)
        assert field.initial is default
    ticked = str(AnswerForm({"type": "object", "properties": {
        "notify": {"type": "boolean", "default": True}}})["notify"])  # fmt: skip
    assert ticked == '<input type="checkbox" name="notify" id="id_notify" checked>'
    # Unticked, it answers false: the tool offered a default, so a box was the right input.
    unticked = form({"notify": {"type": "boolean", "default": True}}, ["notify"], {})
    assert unticked.is_valid() and unticked.content() == {"notify": False}


def test_an_enum_with_titles_shows_the_titles_and_sends_the_values() -> None:
    field = field_for(DECISION, name="decision", required=True)

    assert isinstance(field.widget, forms.RadioSelect)
    assert list(field.choices) == [("approve", "Approve"), ("decline", "Decline")]
    assert field.initial is None
    assert field.label == "Decision"
    html = str(AnswerForm({"type": "object", "properties": {"decision": DECISION},
                           "required": ["decision"]})["decision"])  # fmt: skip
    assert "checked" not in html
    assert re.search(r'value="decline" required id="id_decision_1">\s*Decline</label>', html)

    refused = form({"decision": DECISION}, ["decision"], {})
    assert not refused.is_valid()
    assert refused.errors == {"decision": ["Choose Approve or Decline."]}
    chosen = form({"decision": DECISION}, ["decision"], {"decision": "decline"})
    assert chosen.is_valid() and chosen.content() == {"decision": "decline"}
    assert not form({"decision": DECISION}, ["decision"], {"decision": "maybe"}).is_valid()


def test_an_enum_with_a_default_starts_at_it() -> None:
    prop = {**DECISION, "default": "decline"}
    field = field_for(prop, name="decision", required=True)
    assert field.initial == "decline"
    html = str(AnswerForm({"type": "object", "properties": {"decision": prop}})["decision"])
    assert re.search(r'value="decline" id="id_decision_2" checked>', html)


def test_a_long_enum_is_a_list_that_starts_at_no_choice() -> None:
    prop = {"type": "string", "enum": [f"region-{i}" for i in range(8)]}
    field = field_for(prop, name="region", required=True)
    assert isinstance(field.widget, forms.Select)
    assert next(iter(field.choices)) == ("", "(choose one)")
    refused = form({"region": prop}, ["region"], {"region": ""})
    assert refused.errors == {"region": ["Choose one of the options."]}
    with_default = field_for({**prop, "default": "region-3"}, name="region", required=True)
    assert ("", "(choose one)") not in list(with_default.choices)


def test_the_demo_refund_asks_for_the_decision_itself() -> None:
    check_form_schema(APPROVAL_FORM)  # what an MCP client must accept
    decision = APPROVAL_FORM["properties"]["decision"]
    assert decision["type"] == "string" and "default" not in decision
    assert [o["title"] for o in decision["oneOf"]] == ["Approve", "Decline"]
    assert APPROVAL_FORM["required"] == ["decision"]
    refused = AnswerForm(APPROVAL_FORM, data={"note": "looks fine"})
    assert refused.errors == {"decision": ["Choose Approve or Decline."]}


def test_the_answer_summary_uses_the_words_of_the_form() -> None:
    schema = {
        "type": "object",
        "properties": {
            "decision": DECISION,
            "ship": {"type": "boolean", "title": "Ship it"},
            "pets": {"type": "array", "items": {"anyOf": [{"const": "cat", "title": "Cat"},
                                                          {"const": "dog", "title": "Dog"}]}},
            "note": {"type": "string"},
            "left_out": {"type": "string"},
        },
    }  # fmt: skip
    content = {"decision": "decline", "ship": False, "pets": ["dog", "cat"], "note": "no"}
    assert answer_summary(schema, content) == [
        ("Decision", "Decline"),
        ("Ship it", "No"),
        ("pets", "Dog, Cat"),
        ("note", "no"),
    ]
    assert answer_summary(schema, None) == []
