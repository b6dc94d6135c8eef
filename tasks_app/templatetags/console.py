"""Template helpers of the operator console (the task list and the task page)."""

from __future__ import annotations

from typing import Any

from django import template

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
