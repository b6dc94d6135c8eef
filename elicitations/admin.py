from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from elicitations.models import InputRequest
from tasks_app import operators


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
        # Non-superuser staff see the questions of the tenants their role there lets them see.
        qs = super().get_queryset(request)
        tenants = operators.tenants_where(request.user, operators.VIEW_QUESTIONS)
        return qs if tenants is None else qs.filter(task__client__tenant_id__in=tenants)

    def has_view_permission(self, request: HttpRequest, obj: InputRequest | None = None) -> bool:
        tenant = obj.task.client.tenant_id if obj is not None else None
        return operators.may(request.user, operators.VIEW_QUESTIONS, tenant)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: InputRequest | None = None) -> bool:
        return False
