"""Django forms built from a question's form schema (the MCP restricted subset).

One form field per schema property, named after it, labelled with its title, with its
description as help text and its default as the initial value. Field conversion catches what
the browser sends badly (a word in a number box); the schema itself, through
``schemas.answer_errors``, stays the authority on what a valid answer is, so the inbox and
``tasks/update`` accept exactly the same answers.

A value the schema gives no default is never pre-filled: the answerer chooses it.

- A boolean without a default is two radio buttons, Yes and No, neither selected; when
  required, sending the form without choosing is refused. (A checkbox would answer false for
  whoever never looked at it.) A boolean with a default is a checkbox that starts at it.
- A single-select of up to ``RADIO_LIMIT`` options is radio buttons, longer ones a list; with
  no default, none of its options is selected (a list starts at a "choose one" entry).
- An optional choice also offers "(no answer)" (selected when there is no default), which
  leaves the field out of the answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, date, datetime
from typing import Any

from django import forms

from elicitations import schemas

ACTION_FIELD = "_action"
ACTIONS = ("accept", "decline", "cancel")
# Single-selects with at most this many options show them all at once, as radio buttons.
RADIO_LIMIT = 5
NO_ANSWER = ("", "(no answer)")
YES_NO = [("true", "Yes"), ("false", "No")]


def _choices(options: list[Any]) -> list[tuple[str, str]]:
    return [(o, o) if isinstance(o, str) else (o["const"], o["title"]) for o in options]


def _one_of(titles: list[str]) -> str:
    """What to choose, for the error of a required choice left empty: "Approve or Decline"."""
    if len(titles) > RADIO_LIMIT:
        return "one of the options"
    if len(titles) == 1:
        return titles[0]
    return f"{', '.join(titles[:-1])} or {titles[-1]}"


def _choice_field(
    options: list[tuple[str, str]],
    *,
    required: bool,
    has_default: bool,
    coerce: Any = str,
) -> forms.Field:
    """A single choice among OPTIONS that starts at the default, or at nothing."""
    radios = len(options) <= RADIO_LIMIT
    if not required:
        choices = [NO_ANSWER, *options]
    elif radios or has_default:
        choices = options  # radio buttons start with none selected
    else:
        # A list always shows one entry: without a default it starts at one that is no answer.
        choices = [("", "(choose one)"), *options]
    return forms.TypedChoiceField(
        choices=choices,
        coerce=coerce,
        empty_value=None,
        required=required,
        widget=forms.RadioSelect if radios else forms.Select,
        error_messages={"required": f"Choose {_one_of([t for _, t in options])}."},
    )


def _boolean_field(prop: Mapping[str, Any], required: bool) -> forms.Field:
    if "default" in prop:
        # The tool chose where it starts; unticked is false, which the tool allowed for.
        return forms.BooleanField(required=False)
    # No default: yes or no is the answerer's decision, and nothing is chosen for them.
    return _choice_field(YES_NO, required=required, has_default=False, coerce=_yes)


def _yes(value: str) -> bool:
    return value == "true"


def _html_limits(prop: Mapping[str, Any], pairs: dict[str, str]) -> dict[str, Any]:
    # Limits go on the input for the browser's benefit (maxlength stops typing, min/max tune
    # the spinner); the schema check produces the error messages, so they read the same as
    # the ones tasks/update answers get.
    return {html: prop[key] for key, html in pairs.items() if key in prop}


def _string_field(prop: Mapping[str, Any], required: bool) -> forms.Field:
    if "enum" in prop or "oneOf" in prop:
        options = _choices(prop.get("enum") or prop["oneOf"])
        return _choice_field(options, required=required, has_default="default" in prop)
    attrs = _html_limits(prop, {"minLength": "minlength", "maxLength": "maxlength"})
    match prop.get("format"):
        case "email":
            return forms.CharField(required=required, widget=forms.EmailInput(attrs))
        case "uri":
            return forms.CharField(required=required, widget=forms.URLInput(attrs))
        case "date":
            widget: forms.Widget = forms.DateInput(attrs={"type": "date"}, format="%Y-%m-%d")
            return forms.DateField(required=required, widget=widget)
        case "date-time":
            widget = forms.DateTimeInput(
                attrs={"type": "datetime-local", "step": "1"}, format="%Y-%m-%dT%H:%M:%S"
            )
            return forms.DateTimeField(required=required, widget=widget)
    # strip=False: the answer is passed on as typed; the schema's lengths apply to it as is.
    long_text = (prop.get("maxLength") or 0) > 200
    widget = forms.Textarea({"rows": 3, **attrs}) if long_text else forms.TextInput(attrs)
    return forms.CharField(required=required, strip=False, widget=widget)


def _number_field(prop: Mapping[str, Any], required: bool) -> forms.Field:
    attrs = _html_limits(prop, {"minimum": "min", "maximum": "max"})
    if prop["type"] == "integer":
        return forms.IntegerField(required=required, widget=forms.NumberInput(attrs))
    return forms.FloatField(required=required, widget=forms.NumberInput({"step": "any", **attrs}))


def _multi_select_field(prop: Mapping[str, Any], required: bool) -> forms.Field:
    items = prop["items"]
    return forms.MultipleChoiceField(
        choices=_choices(items.get("enum") or items["anyOf"]),
        required=required,
        widget=forms.CheckboxSelectMultiple,
    )


def _initial(prop: Mapping[str, Any]) -> Any:
    default = prop.get("default")
    if isinstance(default, str) and prop.get("format") == "date":
        return date.fromisoformat(default)
    if isinstance(default, str) and prop.get("format") == "date-time":
        return datetime.fromisoformat(default.upper().replace("Z", "+00:00"))
    return default


def field_for(prop: Mapping[str, Any], *, name: str, required: bool) -> forms.Field:
    """The form field for one schema property (already checked by check_form_schema)."""
    kind = prop["type"]
    if kind == "boolean":
        field: forms.Field = _boolean_field(prop, required)
    elif kind in ("number", "integer"):
        field = _number_field(prop, required)
    elif kind == "array":
        field = _multi_select_field(prop, required)
    else:
        field = _string_field(prop, required)
    field.label = prop.get("title") or name
    field.help_text = prop.get("description", "")
    field.initial = _initial(prop)
    return field


def _sentence(message: str) -> str:
    # Shown next to the input, which already names the field.
    if message == "is required":
        return "This field is required."
    return message[:1].upper() + message[1:] + "."


class AnswerForm(forms.Form):
    """The answer form of one question. ``content()`` is the MCP ElicitResult content."""

    def __init__(self, schema: Mapping[str, Any] | None, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.schema: Mapping[str, Any] = schema or {"type": "object", "properties": {}}
        required = set(self.schema.get("required", []))
        for name, prop in self.schema["properties"].items():
            self.fields[name] = field_for(prop, name=name, required=name in required)

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        converted = set(self.fields) - set(self.errors)
        for name, messages in schemas.answer_errors(self.schema, self.content()).items():
            # A field whose value did not even convert already says so; the schema's
            # "is required" for it would only repeat that.
            if name and name not in converted:
                continue
            for message in messages:
                self.add_error(name or None, _sentence(message))
        return cleaned

    def content(self) -> dict[str, Any]:
        """The typed answer, leaving out optional fields left empty."""
        content: dict[str, Any] = {}
        for name in self.schema["properties"]:
            value = self.cleaned_data.get(name)
            if isinstance(self.fields[name], forms.BooleanField):
                content[name] = bool(value)  # a checkbox always answers
            elif value is None or value in ("", []):
                continue
            elif isinstance(value, datetime):
                content[name] = value.astimezone(UTC).isoformat().replace("+00:00", "Z")
            elif isinstance(value, date):
                content[name] = value.isoformat()
            else:
                content[name] = list(value) if isinstance(value, list) else value
        return content


def answer_summary(schema: Mapping[str, Any] | None, content: Any) -> list[tuple[str, str]]:
    """(label, value) of each answered field, in the words the form showed: the option's
    title for a choice, Yes or No for a boolean. Fields left out of the answer are left out."""
    if not isinstance(content, Mapping):
        return []
    properties: Mapping[str, Any] = (schema or {}).get("properties", {})
    summary = []
    for name, prop in properties.items():
        value = content.get(name)
        if value is None:
            continue
        options = prop.get("oneOf") or prop.get("items", {}).get("anyOf") or []
        titles = {o["const"]: o["title"] for o in options if isinstance(o, Mapping)}
        if isinstance(value, bool):
            text = "Yes" if value else "No"
        elif isinstance(value, list):
            text = ", ".join(str(titles.get(v, v)) for v in value) or "(none)"
        else:
            text = str(titles.get(value, value))
        summary.append((str(prop.get("title") or name), text))
    return summary
