"""Template helpers for the operator pages.

Everything here returns plain strings that the template engine escapes: tool and client
text (arguments, messages, results) is untrusted and is never marked safe.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from django import template
from django.utils import timezone
from django.utils.timesince import timesince

register = template.Library()

SUMMARY_LIMIT = 80


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


@register.filter
def argument_summary(arguments: Any, limit: int = SUMMARY_LIMIT) -> list[tuple[str, str]]:
    """(name, value) pairs of a task's arguments, each value cut to LIMIT characters.

    Arguments that are null (an optional one the call left out, such as a ``request_key`` whose
    key came in the Idempotency-Key header instead) say nothing to the reader and are left out;
    the task page shows the arguments in full."""
    if not isinstance(arguments, Mapping):
        return [("", _cut(json.dumps(arguments, ensure_ascii=False), limit))]
    return [
        (
            str(name),
            _cut(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False), limit),
        )
        for name, value in arguments.items()
        if value is not None
    ]


@register.filter
def age(moment: datetime | None) -> str:
    """How long ago MOMENT was, for people: "just now", "5 minutes ago"."""
    if moment is None:
        return ""
    if timezone.now() - moment < timedelta(minutes=1):
        return "just now"
    return f"{timesince(moment)} ago"


@register.filter
def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=str)


@register.filter
def minutes(value: timedelta | None) -> str:
    """A duration in whole minutes, e.g. "15 minutes" (at least one)."""
    if value is None:
        return ""
    count = max(1, round(value.total_seconds() / 60))
    return f"{count} minute{'s' if count != 1 else ''}"


@register.filter
def may_read_audit(user: Any) -> bool:
    """Whether the nav shows the audit log: USER may read it in some tenant."""
    from tasks_app import operators

    return operators.may(user, operators.VIEW_AUDIT)
