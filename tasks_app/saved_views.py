"""Saved views of the task list: save one, list the ones an operator may open, delete one's
own, and the default list after signing in.

A view is the list's query string under a name. Its owner always sees it; a shared view
(one with a tenant) is seen by everyone who may see that tenant's tasks, and only the owner
may delete it. A view can only be shared with a tenant the owner may see, so a view never
reaches a tenant its owner does not belong to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet

from tasks_app import operators
from tasks_app.listing.query import TaskFilters
from tasks_app.models import SavedView, Tenant

NAME_MAX = 80
# Set in the session by a sign-in: the next plain /tasks/ opens the operator's default view.
JUST_SIGNED_IN = "taskdesk_just_signed_in"


class Refused(ValueError):
    """A view that cannot be saved: the message says why."""


@dataclass(frozen=True)
class Shown:
    """A view as the list names it: its link, and whether it is the operator's own."""

    view: SavedView
    url_query: str
    own: bool


def query_of(filters: TaskFilters) -> str:
    """The query string a view keeps for FILTERS: the list's own, without a page."""
    return urlencode(filters.query())


def tenants_to_share_with(user: Any) -> list[Tenant]:
    """The tenants USER may share a view with: those whose tasks they may see."""
    ids = operators.tenants_where(user, operators.VIEW_TASKS)
    qs = Tenant.objects.order_by("slug")
    return list(qs if ids is None else qs.filter(pk__in=ids))


def visible_to(user: Any) -> QuerySet[SavedView]:
    """The views USER may open: their own, and those shared with a tenant whose tasks they
    may see; by name."""
    ids = operators.tenants_where(user, operators.VIEW_TASKS)
    shared = Q(tenant__isnull=False) if ids is None else Q(tenant_id__in=ids)
    return (
        SavedView.objects.filter(Q(owner=user.pk) | shared)
        .select_related("tenant", "owner")
        .order_by("name", "pk")
    )


def shown_to(user: Any) -> list[Shown]:
    return [Shown(view, view.query, view.owner_id == user.pk) for view in visible_to(user)]


def save(
    *, user: Any, name: str, filters: TaskFilters, tenant: str = "", default: bool = False
) -> SavedView:
    """Save FILTERS as NAME (replacing USER's view of that name), shared with TENANT (a
    slug) when given; DEFAULT makes it the list USER lands on after signing in."""
    name = name.strip()[:NAME_MAX]
    if not name:
        raise Refused("Give the view a name.")
    if filters.errors:
        raise Refused("This list has errors; fix its filters before saving it.")
    shared_with = None
    if tenant:
        shared_with = next((t for t in tenants_to_share_with(user) if t.slug == tenant), None)
        if shared_with is None:
            raise Refused(f"You cannot share a view with “{tenant[:40]}”.")
    with transaction.atomic():
        if default:
            SavedView.objects.filter(owner=user.pk, is_default=True).update(is_default=False)
        try:
            view, _ = SavedView.objects.update_or_create(
                owner=user,
                name=name,
                defaults={
                    "query": query_of(filters),
                    "tenant": shared_with,
                    "is_default": default,
                },
            )
        except IntegrityError:  # a concurrent save of another default
            raise Refused("Another default view was saved at the same time; try again.") from None
    return view


def delete(*, user: Any, view_id: int) -> SavedView | None:
    """Delete USER's own view VIEW_ID and return it; None when there is no such view of theirs."""
    view = SavedView.objects.filter(pk=view_id, owner=user.pk).first()
    if view is not None:
        view.delete()
    return view


def default_of(user: Any) -> SavedView | None:
    return SavedView.objects.filter(owner=user.pk, is_default=True).first()


def opening(request: Any) -> SavedView | None:
    """The default view to open instead of a plain /tasks/ right after signing in (once)."""
    if not request.session.pop(JUST_SIGNED_IN, False):
        return None
    view = default_of(request.user)
    return view if view is not None and view.query else None


def signed_in(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    """Connected to ``user_logged_in``: the next plain /tasks/ is the default view."""
    if request is not None and hasattr(request, "session"):
        request.session[JUST_SIGNED_IN] = True
