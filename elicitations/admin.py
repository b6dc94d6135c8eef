from __future__ import annotations

from django.contrib import admin

from elicitations.models import InputRequest


@admin.register(InputRequest)
class InputRequestAdmin(admin.ModelAdmin):
    # Read-only: answers go through elicitations.transitions (the inbox or tasks/update), so
    # every change is checked and lands in the task's timeline.
    list_display = ["key", "task", "audience", "mode", "status", "deadline", "created_at"]
    list_filter = ["status", "audience", "mode", "channel"]
    search_fields = ["key", "ask_key", "task__id"]
    list_select_related = ["task"]
    readonly_fields = [f.name for f in InputRequest._meta.fields]

    def get_queryset(self, request):  # type: ignore[no-untyped-def]
        # Non-superuser staff see the questions of their tenants only.
        qs = super().get_queryset(request)
        if request.user.is_superuser:
            return qs
        return qs.filter(task__client__tenant__members=request.user).distinct()

    def has_add_permission(self, request) -> bool:  # type: ignore[no-untyped-def]
        return False

    def has_delete_permission(self, request, obj=None) -> bool:  # type: ignore[no-untyped-def]
        return False
