"""Saved views: a filtered task list kept under a name, by an operator for themselves or
shared with a tenant's operators."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from tasks_app.models.clients import Tenant


class SavedView(models.Model):
    """A name for the task list's query string (``query``: exactly what /tasks/ reads, so
    the view is a URL underneath and a link to it keeps working). ``tenant`` set: shared with
    everyone who may see that tenant's tasks; NULL: the owner's alone. ``is_default``: the
    owner's list after signing in (one per owner)."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="saved_views"
    )
    name = models.CharField(max_length=80)
    query = models.CharField(max_length=2000, blank=True)
    tenant = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="saved_views"
    )
    is_default = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["owner", "name"], name="view_name_per_owner"),
            models.UniqueConstraint(
                fields=["owner"], condition=Q(is_default=True), name="view_one_default"
            ),
        ]
        indexes = [models.Index(fields=["tenant"], name="view_tenant")]

    def __str__(self) -> str:
        return self.name
