"""The admin: tenants, clients and tokens are edited here; tasks and their records are read.

Non-superuser staff see only the rows of the tenants they are members of. Tasks, events,
effects and journal entries are history: they change only through ``tasks_app.transitions``
and the runtime, so the admin neither edits nor deletes them. A revoked token stays revoked.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse

from tasks_app import audit, operators, tokens, webhooks
from tasks_app.models import (
    AuditAction,
    AuditEntry,
    Client,
    ClientToken,
    Effect,
    JournalEntry,
    Membership,
    OAuthApp,
    OAuthGrant,
    OperatorToken,
    PurgedTask,
    Task,
    TaskEvent,
    Tenant,
    WebhookEndpoint,
    WebhookEvent,
)
from tasks_app.oauth import builtin
from tasks_app.oauth.redirects import RedirectRefused, check_redirect_uri
from tasks_app.tools.registry import load_toolsets


class TenantScoped(admin.ModelAdmin[Any]):
    """Limits non-superuser staff to their tenants' rows (TENANT_PATH leads to the Tenant)."""

    tenant_path = "tenant"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        qs = super().get_queryset(request)
        if request.user.is_superuser:
            return qs
        return qs.filter(**{f"{self.tenant_path}__members": request.user.pk}).distinct()

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if not request.user.is_superuser:
            if db_field.related_model is Tenant:
                kwargs["queryset"] = Tenant.objects.filter(members=request.user.pk)
            elif db_field.related_model is Client:
                kwargs["queryset"] = Client.objects.filter(tenant__members=request.user.pk)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


class ShownOnce(TenantScoped):
    """Adding a row makes a secret that is shown this once, on the page that answers the add
    (SHOWN_ONCE_TEMPLATE, given the row, a TITLE and the secret); ``save_model`` hands it to
    ``show_once``."""

    shown_once_template = ""

    def show_once(self, request: HttpRequest, secret: str) -> None:
        request.shown_once = secret  # type: ignore[attr-defined]

    def shown_once_title(self, obj: Any) -> str:
        raise NotImplementedError

    def response_add(self, request: HttpRequest, obj: Any, post_url_continue: Any = None) -> Any:
        secret = getattr(request, "shown_once", None)
        if secret is None:
            return super().response_add(request, obj, post_url_continue)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": self.shown_once_title(obj),
            "secret": secret,
            "row": obj,
        }
        return TemplateResponse(request, self.shown_once_template, context)


class Audited:
    """Each add, change and delete of a row writes an audit entry (``tasks_app.audit``), in
    the admin's transaction: AUDIT_ACTIONS maps "add", "change" and "delete" to the action
    (a missing key: not audited); ``audit_of`` names the row's tenant and target."""

    audit_actions: dict[str, AuditAction] = {}

    def audit_of(self, obj: Any) -> tuple[int | None, str]:
        raise NotImplementedError

    def audit_action(self, obj: Any, verb: str, message: Any) -> AuditAction | None:
        return self.audit_actions.get(verb)

    def _audit(self, request: HttpRequest, obj: Any, verb: str, message: Any = "") -> None:
        action = self.audit_action(obj, verb, message)
        if action is not None:
            tenant, target = self.audit_of(obj)
            audit.record(audit.Who.of(request), action, tenant=tenant, target=target,
                         via="admin", row=str(obj), change=message)  # fmt: skip

    def log_addition(self, request: HttpRequest, obj: Any, message: Any) -> Any:
        self._audit(request, obj, "add", message)
        return super().log_addition(request, obj, message)  # type: ignore[misc]

    def log_change(self, request: HttpRequest, obj: Any, message: Any) -> Any:
        self._audit(request, obj, "change", message)
        return super().log_change(request, obj, message)  # type: ignore[misc]

    def log_deletions(self, request: HttpRequest, queryset: Any) -> Any:
        for obj in queryset:
            self._audit(request, obj, "delete")
        return super().log_deletions(request, queryset)  # type: ignore[misc]


class History:
    """Read-only: rows that change only through transitions."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class MembershipInline(admin.TabularInline[Membership, Tenant]):
    """The tenant's members and each one's role in this tenant. Non-superuser staff choose
    among the users of their own tenants and those in no tenant yet, never a superuser or
    someone only another tenant knows."""

    model = Membership
    extra = 1
    fields = ["user", "role"]

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "user" and not request.user.is_superuser:
            users = get_user_model().objects.filter(is_superuser=False)
            kwargs["queryset"] = users.filter(
                Q(tenants__members=request.user.pk) | Q(tenants__isnull=True)
            ).distinct()
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


@admin.register(Tenant)
class TenantAdmin(Audited, admin.ModelAdmin[Tenant]):
    list_display = ["slug", "created_at"]
    inlines = [MembershipInline]

    def audit_of(self, obj: Any) -> tuple[int | None, str]:
        return obj.pk, f"tenant:{obj.slug}"

    def audit_action(self, obj: Any, verb: str, message: Any) -> AuditAction | None:
        # A change that adds, changes or removes a membership (a member and their role).
        touched = [
            entry
            for entry in (message if isinstance(message, list) else [])
            for what in entry.values()
            if isinstance(what, dict) and what.get("name") == Membership._meta.verbose_name
        ]
        return AuditAction.ROLE_CHANGE if touched else None

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        qs = super().get_queryset(request)
        return qs if request.user.is_superuser else qs.filter(members=request.user.pk)


class ClientForm(forms.ModelForm[Client]):
    """A client, and the tools it may call: ticked among the tools of the configured
    toolsets (a name saved earlier whose tool is gone stays listed until it is unticked)."""

    allowed_tools = forms.MultipleChoiceField(
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="The tools this client may call, whatever its token (static or OAuth). "
        "None ticked: every tool.",
    )

    class Meta:
        model = Client
        fields = ["name", "tenant", "allowed_tools"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        names = {name for toolset in load_toolsets(settings.TASKDESK_TOOLSETS)
                 for name in toolset.tools}  # fmt: skip
        saved = self.instance.allowed_tools if isinstance(self.instance.allowed_tools, list) else []
        field = self.fields["allowed_tools"]
        assert isinstance(field, forms.MultipleChoiceField)
        field.choices = [(name, name) for name in sorted(names | set(saved))]


@admin.register(Client)
class ClientAdmin(TenantScoped):
    form = ClientForm
    list_display = ["name", "tenant", "tools", "created_at"]
    # Only the tenants of the clients listed: staff see their own tenants' names alone.
    list_filter = [("tenant", admin.RelatedOnlyFieldListFilter)]

    @admin.display(description="tools")
    def tools(self, obj: Client) -> str:
        return ", ".join(obj.allowed_tools) if obj.allowed_tools else "all"


@admin.register(ClientToken)
class ClientTokenAdmin(Audited, ShownOnce):
    tenant_path = "client__tenant"
    shown_once_template = "admin/tasks_app/clienttoken/issued.html"
    list_display = ["prefix", "client", "created_at", "revoked_at"]
    readonly_fields = ["token_hash", "prefix", "client", "created_at"]

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:  # adding: choose the client; the token is made on saving
            return ["client"]
        return super().get_fields(request, obj)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        if obj is None:
            return []
        fields = list(super().get_readonly_fields(request, obj))
        if obj.revoked_at is not None:
            fields.append("revoked_at")  # a revoked token cannot be un-revoked
        return fields

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        if not change:
            self.show_once(request, tokens.fill(obj))
        super().save_model(request, obj, form, change)

    def shown_once_title(self, obj: Any) -> str:
        return f"New token of {obj.client}"

    def audit_of(self, obj: Any) -> tuple[int | None, str]:
        return obj.client.tenant_id, f"client:{obj.client_id}"

    def audit_action(self, obj: Any, verb: str, message: Any) -> AuditAction | None:
        if verb == "add":
            return AuditAction.TOKEN_CREATE
        if verb == "delete" or obj.revoked_at is not None:
            return AuditAction.TOKEN_REVOKE
        return None


class OperatorTokenForm(forms.ModelForm[OperatorToken]):
    class Meta:
        model = OperatorToken
        fields = ["user", "name"]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        user, name = data.get("user"), data.get("name")
        live = OperatorToken.objects.filter(user=user, name=name, revoked_at__isnull=True)
        if user is not None and name and live.exists():
            raise forms.ValidationError(f"{user} already has a live token named {name!r}.")
        return data


@admin.register(OperatorToken)
class OperatorTokenAdmin(Audited, ShownOnce):
    """Personal operator tokens for /api/ (``manage.py create_operator_token`` makes them too).
    A token acts as its user, so staff who are not superusers see, make and revoke only their
    own. A token is never edited or deleted: it is revoked, and stays listed."""

    form = OperatorTokenForm
    shown_once_template = "admin/tasks_app/operatortoken/issued.html"
    list_display = ["prefix", "name", "user", "created_at", "last_used_at", "revoked_at"]
    list_filter = [("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["name", "prefix", "user__username"]
    readonly_fields = ["user", "name", "prefix", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke"]
    audit_actions = {"add": AuditAction.OPERATOR_TOKEN_CREATE}

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        qs = admin.ModelAdmin.get_queryset(self, request)  # by user, not by tenant
        return qs if request.user.is_superuser else qs.filter(user=request.user.pk)

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "user" and not request.user.is_superuser:
            kwargs["queryset"] = get_user_model().objects.filter(pk=request.user.pk or 0)
        return admin.ModelAdmin.formfield_for_foreignkey(self, db_field, request, **kwargs)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return ["user", "name"] if obj is None else self.readonly_fields

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [] if obj is None else list(self.readonly_fields)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        if not change:
            self.show_once(request, tokens.fill(obj, prefix=tokens.OPERATOR_TOKEN_PREFIX))
        super().save_model(request, obj, form, change)

    def shown_once_title(self, obj: Any) -> str:
        return f"New operator token {obj.name!r} of {obj.user}"

    def audit_of(self, obj: Any) -> tuple[int | None, str]:
        return None, f"user:{obj.user.get_username()}"

    @admin.action(description="Revoke the selected tokens", permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[OperatorToken]) -> None:
        who = audit.Who.of(request)
        with transaction.atomic():
            revoked = [
                row
                for token in queryset.filter(revoked_at__isnull=True).select_related("user")
                for row in tokens.revoke_operator_tokens(token.user, name=token.name)
            ]
            for row in revoked:
                audit.record(who, AuditAction.OPERATOR_TOKEN_REVOKE,
                             target=f"user:{row.user.get_username()}", via="admin",
                             name=row.name, prefix=row.prefix)  # fmt: skip
        self.message_user(request, f"Revoked {len(revoked)} token(s).")


class EventInline(History, admin.TabularInline[TaskEvent, Task]):
    model = TaskEvent
    extra = 0
    readonly_fields = [
        "created_at",
        "kind",
        "actor_type",
        "actor",
        "old_status",
        "new_status",
        "detail",
    ]


class EffectInline(History, admin.TabularInline[Effect, Task]):
    model = Effect
    extra = 0
    readonly_fields = [
        "seq",
        "name",
        "target",
        "state",
        "downstream_key",
        "compensable",
        "detail",
        "created_at",
        "settled_at",
    ]


class JournalInline(History, admin.TabularInline[JournalEntry, Task]):
    model = JournalEntry
    extra = 0
    readonly_fields = ["seq", "kind", "name", "outcome", "created_at"]


@admin.register(Task)
class TaskAdmin(History, TenantScoped):
    """Staff see the tasks of the tenants where their role lets them view tasks."""

    tenant_path = "client__tenant"
    list_display = ["id", "tool_name", "client", "status", "created_at"]
    list_filter = ["status", "tool_name", "era"]
    search_fields = ["^id", "=idempotency_key", "tool_name"]
    list_select_related = ["client"]
    readonly_fields = [f.name for f in Task._meta.fields]
    inlines = [EffectInline, JournalInline, EventInline]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        qs = admin.ModelAdmin.get_queryset(self, request)
        tenants = operators.tenants_where(request.user, operators.VIEW_TASKS)
        return qs if tenants is None else qs.filter(client__tenant_id__in=tenants)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        tenant = obj.client.tenant_id if obj is not None else None
        return operators.may(request.user, operators.VIEW_TASKS, tenant)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)


@admin.register(PurgedTask)
class PurgedTaskAdmin(History, admin.ModelAdmin[PurgedTask]):
    """The archive of purged tasks (``manage.py export_purged_tasks`` exports it). Its lines
    carry no tenant, only the client's id and name: superusers only."""

    list_display = ["task_id", "client_name", "idempotency_key", "tool_name", "status", "purged_at"]
    list_filter = ["status", "tool_name"]
    search_fields = ["=task_id", "=idempotency_key", "=client_name"]
    readonly_fields = [f.name for f in PurgedTask._meta.fields]

    def has_module_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.is_superuser)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_superuser)


class WebhookEndpointForm(forms.ModelForm[WebhookEndpoint]):
    url = forms.URLField(max_length=2000, assume_scheme="https")
    events = forms.MultipleChoiceField(
        choices=WebhookEvent.choices, widget=forms.CheckboxSelectMultiple
    )

    class Meta:
        model = WebhookEndpoint
        fields = ["client", "url", "events", "description", "enabled"]

    def clean_url(self) -> str:
        url = str(self.cleaned_data["url"])
        if self.instance.pk is None or url != self.instance.url:
            webhooks.check_url(url)
        return url


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(Audited, ShownOnce):
    """A client's webhook endpoints. The secret is made on saving a new one and shown once;
    an endpoint disabled after failing for the retry window shows here as such (enable it
    again once the receiver works)."""

    form = WebhookEndpointForm
    tenant_path = "client__tenant"
    shown_once_template = "admin/tasks_app/webhookendpoint/registered.html"
    list_display = ["url", "client", "enabled", "failing_since", "disabled_at", "created_at"]
    list_filter = ["enabled"]
    readonly_fields = ["failing_since", "disabled_at", "disabled_reason", "created_at"]

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        if not change:
            obj.secret = webhooks.new_secret()
            self.show_once(request, obj.secret)
        elif "enabled" in form.changed_data and obj.enabled:
            obj.failing_since = obj.disabled_at = None
            obj.disabled_reason = ""
        super().save_model(request, obj, form, change)

    def shown_once_title(self, obj: Any) -> str:
        return f"Webhook endpoint of {obj.client}"

    audit_actions = {
        "add": AuditAction.WEBHOOK_ADD,
        "change": AuditAction.WEBHOOK_CHANGE,
        "delete": AuditAction.WEBHOOK_REMOVE,
    }

    def audit_of(self, obj: Any) -> tuple[int | None, str]:
        return obj.client.tenant_id, f"client:{obj.client_id}"


@admin.register(AuditEntry)
class AuditEntryAdmin(History, admin.ModelAdmin[AuditEntry]):
    """The audit log, read-only (the console's /audit/ filters and exports it)."""

    list_display = ["at", "actor", "address", "action", "tenant", "target", "outcome"]
    list_filter = ["action", "outcome"]
    search_fields = ["actor", "target"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return audit.entries_for(request.user)


# --- the built-in authorization server --------------------------------------------------------


class OAuthAppForm(forms.ModelForm[OAuthApp]):
    """A pre-registered app: its redirect URIs one a line, checked as registration checks
    them. A confidential app (client_secret_basic or client_secret_post) gets a secret."""

    redirect_uris_text = forms.CharField(
        label="Redirect URIs",
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="One a line: https, http to a loopback host, or a native app's own scheme.",
    )
    client_uri = forms.URLField(required=False, assume_scheme="https", label="Home page")
    token_endpoint_auth_method = forms.ChoiceField(
        choices=[(m, m) for m in ("none", "client_secret_basic", "client_secret_post")],
        help_text="none: a public app that uses PKCE only; the others get a secret, shown once.",
    )

    class Meta:
        model = OAuthApp
        fields = ["name", "token_endpoint_auth_method", "client_uri", "disabled"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["redirect_uris_text"].initial = "\n".join(self.instance.redirect_uris or [])

    def clean_redirect_uris_text(self) -> list[str]:
        uris = [line.strip() for line in self.cleaned_data["redirect_uris_text"].splitlines()]
        uris = [uri for uri in uris if uri]
        for uri in uris:
            try:
                check_redirect_uri(uri)
            except RedirectRefused as exc:
                raise forms.ValidationError(f"Refused: {exc}.") from None
        if not uris:
            raise forms.ValidationError("Give at least one redirect URI.")
        return uris


@admin.register(OAuthApp)
class OAuthAppAdmin(admin.ModelAdmin[OAuthApp]):
    """The apps of the built-in authorization server. Apps registered here are pre-registered
    clients; the others registered themselves or are metadata documents (read here, and
    stopped with ``disabled``)."""

    form = OAuthAppForm
    list_display = ["name", "kind", "client_id", "token_endpoint_auth_method", "disabled"]
    list_filter = ["kind", "disabled"]
    search_fields = ["name", "client_id"]
    readonly_fields = ["client_id", "kind", "fetched_at", "fresh_until", "created_at"]

    def save_model(self, request: HttpRequest, obj: OAuthApp, form: Any, change: bool) -> None:
        obj.redirect_uris = form.cleaned_data["redirect_uris_text"]
        if not change:
            obj.kind = OAuthApp.Kind.REGISTERED
            obj.client_id = builtin.new_secret("tdapp_")
        if obj.token_endpoint_auth_method == "none":
            obj.client_secret_hash = ""
        elif not obj.client_secret_hash:
            secret = builtin.new_secret("tdas_")
            obj.client_secret_hash = builtin.hash_secret(secret)
            request.shown_once = secret  # type: ignore[attr-defined]
        super().save_model(request, obj, form, change)

    def response_add(self, request: HttpRequest, obj: Any, post_url_continue: Any = None) -> Any:
        return self._shown_once(request, obj) or super().response_add(request, obj)

    def response_change(self, request: HttpRequest, obj: Any) -> Any:
        return self._shown_once(request, obj) or super().response_change(request, obj)

    def _shown_once(self, request: HttpRequest, obj: OAuthApp) -> Any:
        secret = getattr(request, "shown_once", None)
        if secret is None:
            return None
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"The secret of {obj.name}",
            "secret": secret,
            "row": obj,
        }
        return TemplateResponse(request, "admin/tasks_app/oauthapp/secret.html", context)


@admin.register(OAuthGrant)
class OAuthGrantAdmin(History, TenantScoped):
    """Connected apps, read here; revoked on the console's Connected apps page."""

    list_display = [
        "app",
        "person",
        "tenant",
        "client",
        "scopes",
        "created_at",
        "last_used_at",
        "revoked_at",
    ]
    list_filter = ["tenant"]
