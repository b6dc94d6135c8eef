"""Template helpers of the operator console (the task list and the task page)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django import template
from django.utils import timezone

from tasks_app.templatetags.operator_ui import age

register = template.Library()


@register.filter
def thousands(value: Any) -> str:
    """12345 -> "12,345" (without django.contrib.humanize's locale machinery)."""
    try:
        return f"{int(value):,}"
    except (TypeError, ValueError):
        return str(value)


@register.filter
def get_item(mapping: Any, key: Any) -> Any:
    try:
        return mapping.get(key)
    except AttributeError:
        return None


@register.filter
def iso_time(moment: datetime | None) -> str:
    """An absolute date-time in UTC, ISO 8601: "2026-12-04T19:45:12Z"."""
    if moment is None:
        return ""
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


@register.filter
def short_time(moment: datetime | None) -> str:
    """When MOMENT was, short: relative within a day ("5 minutes ago"), else the date and
    time in UTC ("3 Dec 14:05", with the year when it is not this one's)."""
    if moment is None:
        return ""
    now = timezone.now()
    if now - moment < timedelta(days=1):
        return age(moment)
    moment = moment.astimezone(UTC)
    if moment.year == now.astimezone(UTC).year:
        return f"{moment.day} {moment:%b %H:%M}"
    return f"{moment.day} {moment:%b %Y}"


def _span(seconds: float) -> str:
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))} ms"
    if seconds < 10:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    for unit, size, smaller, small_size in (
        ("d", 86400, "h", 3600),
        ("h", 3600, "min", 60),
        ("min", 60, "s", 1),
    ):
        if whole >= size:
            big, rest = divmod(whole, size)
            part = rest // small_size
            return f"{big} {unit} {part} {smaller}" if part else f"{big} {unit}"
    return f"{whole} s"  # unreachable


@register.filter
def task_duration(task: Any) -> str:
    """How long TASK ran (finished_at - created_at), or has run so far ("… so far")."""
    created = getattr(task, "created_at", None)
    if created is None:
        return ""
    finished = getattr(task, "finished_at", None)
    if finished is not None:
        return _span((finished - created).total_seconds())
    return f"{_span((timezone.now() - created).total_seconds())} so far"
