"""The inbox badge: how many questions wait for the signed-in operator."""

from __future__ import annotations

from django import template
from django.contrib.auth.models import AnonymousUser, User

from elicitations import selectors

register = template.Library()


@register.simple_tag
def inbox_count_for(user: User | AnonymousUser) -> int:
    """How many questions wait for USER in the inbox (0 for anonymous visitors)."""
    if not user.is_authenticated:
        return 0
    return selectors.inbox_count(user=user)
