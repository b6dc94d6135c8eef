from __future__ import annotations

from django.contrib import admin

from tasks_app.models import Client, ClientToken, Effect, Task, TaskEvent, Tenant


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin[Tenant]):
    list_display = ["slug", "created_at"]
    filter_horizontal = ["members"]


@admin.register(Client)
class ClientAdmin(admin.ModelAdmin[Client]):
    list_display = ["name", "tenant", "created_at"]
    list_filter = ["tenant"]


@admin.register(ClientToken)
class ClientTokenAdmin(admin.ModelAdmin[ClientToken]):
    list_display = ["prefix", "client", "created_at", "revoked_at"]
    readonly_fields = ["token_hash", "prefix", "client", "created_at"]


class EventInline(admin.TabularInline[TaskEvent, Task]):
    model = TaskEvent
    extra = 0
    can_delete = False
    readonly_fields = [
        "created_at",
        "kind",
        "actor_type",
        "actor",
        "old_status",
        "new_status",
        "detail",
    ]


class EffectInline(admin.TabularInline[Effect, Task]):
    model = Effect
    extra = 0
    can_delete = False
    readonly_fields = ["seq", "name", "target", "state", "downstream_key", "detail", "updated_at"]


@admin.register(Task)
class TaskAdmin(admin.ModelAdmin[Task]):
    # Status is read-only here: every change goes through tasks_app.transitions.
    list_display = ["id", "tool_name", "client", "status", "created_at"]
    list_filter = ["status", "tool_name", "era"]
    search_fields = ["id", "idempotency_key", "tool_name"]
    readonly_fields = [f.name for f in Task._meta.fields]
    inlines = [EffectInline, EventInline]
