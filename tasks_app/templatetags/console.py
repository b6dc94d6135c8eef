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


def coarse_span(seconds: float) -> str:
    """A span for a page that refreshes itself, in steps that do not change on every refresh
    (so that an unchanged page is answered with 204): "under 5 s", then 5 s steps up to a
    minute, then whole minutes ("3 min", "1 h 5 min")."""
    whole = max(0, int(seconds))
    if whole < 5:
        return "under 5 s"
    if whole < 60:
        return f"{whole - whole % 5} s"
    return _span(whole - whole % 60)


@register.filter
def span_to(moment: datetime | None, now: datetime) -> str:
    """How long from MOMENT to NOW, coarsely (``coarse_span``)."""
    if moment is None:
        return ""
    return coarse_span((now - moment).total_seconds())


@register.filter
def lease_left(expires: datetime | None, now: datetime) -> str:
    """When a lease that expires at EXPIRES runs out, seen at NOW: "runs out in 25 s" or
    "ran out 10 s ago"."""
    if expires is None:
        return ""
    left = (expires - now).total_seconds()
    if left > 0:
        return f"runs out in {coarse_span(left)}"
    return f"ran out {coarse_span(-left)} ago"


@register.filter
def may_see_workers(user: Any) -> bool:
    """Whether the nav shows /workers/: USER may see tasks in some tenant."""
    from tasks_app import operators

    return operators.may(user, operators.VIEW_TASKS)
