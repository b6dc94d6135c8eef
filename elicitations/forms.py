"""Django forms built from a question's form schema (the MCP restricted subset).

One form field per schema property, named after it, labelled with its title, with its
description as help text and its default as the initial value. Field conversion catches what
the browser sends badly (a word in a number box); the schema itself, through
``schemas.answer_errors``, stays the authority on what a valid answer is, so the inbox and
``tasks/update`` accept exactly the same answers.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, date, datetime
from typing import Any

from django import forms

from elicitations import schemas

ACTION_FIELD = "_action"
ACTIONS = ("accept", "decline", "cancel")


def _choices(options: list[Any]) -> list[tuple[str, str]]:
    return [(o, o) if isinstance(o, str) else (o["const"], o["title"]) for o in options]


def _html_limits(prop: Mapping[str, Any], pairs: dict[str, str]) -> dict[str, Any]:
    # Limits go on the input for the browser's benefit (maxlength stops typing, min/max tune
    # the spinner); the schema check produces the error messages, so they read the same as
    # the ones tasks/update answers get.
    return {html: prop[key] for key, html in pairs.items() if key in prop}


def _string_field(prop: Mapping[str, Any], required: bool) -> forms.Field:
    if "enum" in prop or "oneOf" in prop:
        choices = _choices(prop.get("enum") or prop["oneOf"])
        if not required:
            choices = [("", "(none)"), *choices]
        return forms.ChoiceField(choices=choices, required=required)
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
    widget = forms.Textarea(attrs) if long_text else forms.TextInput(attrs)
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
        # A checkbox always answers: unchecked is false, so a required boolean is satisfied.
        field: forms.Field = forms.BooleanField(required=False)
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
        for name, prop in self.schema["properties"].items():
            value = self.cleaned_data.get(name)
            if prop["type"] == "boolean":
                content[name] = bool(value)
            elif value is None or value in ("", []):
                continue
            elif isinstance(value, datetime):
                content[name] = value.astimezone(UTC).isoformat().replace("+00:00", "Z")
            elif isinstance(value, date):
                content[name] = value.isoformat()
            else:
                content[name] = list(value) if isinstance(value, list) else value
        return content
