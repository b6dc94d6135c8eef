from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from elicitations.models import InputRequest


@admin.register(InputRequest)
class InputRequestAdmin(admin.ModelAdmin[InputRequest]):
    # Read-only: answers go through elicitations.transitions (the inbox or tasks/update), so
    # every change is checked and lands in the task's timeline.
    list_display = ["key", "task", "audience", "mode", "status", "deadline", "created_at"]
    list_filter = ["status", "audience", "mode", "channel"]
    search_fields = ["key", "ask_key", "task__id"]
    list_select_related = ["task"]
    readonly_fields = [f.name for f in InputRequest._meta.fields]

    def get_queryset(self, request: HttpRequest) -> QuerySet[InputRequest]:
        # Non-superuser staff see the questions of their tenants only.
        qs = super().get_queryset(request)
        if request.user.is_superuser:
            return qs
        return qs.filter(task__client__tenant__members=request.user.pk).distinct()

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: InputRequest | None = None) -> bool:
        return False
