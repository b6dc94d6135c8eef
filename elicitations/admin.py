from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from elicitations.models import InputRequest, QuestionRoute, TenantChat
from tasks_app import operators, webhooks
from tasks_app.models import Tenant


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


class _OwnTenants(admin.ModelAdmin[Any]):
    """Rows of a tenant: non-superuser staff see and choose their own tenants only."""

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        qs = super().get_queryset(request)
        if getattr(request.user, "is_superuser", False):
            return qs
        return qs.filter(tenant_id__in=list(operators.roles_of(request.user)))

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        field = super().formfield_for_foreignkey(db_field, request, **kwargs)
        superuser = getattr(request.user, "is_superuser", False)
        if db_field.name == "tenant" and field is not None and not superuser:
            field.queryset = Tenant.objects.filter(pk__in=list(operators.roles_of(request.user)))
        return field


@admin.register(QuestionRoute)
class QuestionRouteAdmin(_OwnTenants):
    """Who of a tenant is told of a tool's questions, instead of every answerer."""

    list_display = ["tool_name", "tenant", "group"]
    list_filter = ["tenant"]
    filter_horizontal = ["members"]


class TenantChatForm(forms.ModelForm[TenantChat]):
    webhook_url = forms.URLField(max_length=2000, assume_scheme="https")

    class Meta:
        model = TenantChat
        fields = ["tenant", "webhook_url", "enabled"]

    def clean_webhook_url(self) -> str:
        url: str = self.cleaned_data["webhook_url"]
        webhooks.check_url(url)  # the same rules as a client's webhook endpoint
        return url


@admin.register(TenantChat)
class TenantChatAdmin(_OwnTenants):
    """A tenant's Slack-compatible incoming webhook for questions waiting in its inbox."""

    form = TenantChatForm
    list_display = ["tenant", "enabled"]
