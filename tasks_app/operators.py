"""Who may use the operator pages: the login decorator every page shares, the request type
of those pages, the change token their polls send back, and the roles."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from functools import wraps
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django_htmx.http import HttpResponseClientRedirect
from django_htmx.middleware import HtmxDetails

View = Callable[..., HttpResponseBase]


class HtmxHttpRequest(HttpRequest):
    """The request of an operator page: django-htmx's details, and a logged-in user (every
    such view is behind ``operator_login_required``)."""

    htmx: HtmxDetails
    user: User


def change_token(*parts: object) -> str:
    """A short token that changes when any of PARTS does. A page's poll sends back the one it
    was drawn with; the view answers 204 (or stops the polling) while it is unchanged."""
    text = "|".join(str(part) for part in parts)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def operator_login_required(view: View) -> View:
    """``login_required`` that also works for htmx requests.

    A poll or panel request of a session that has expired would follow the plain redirect and
    swap the login page into the list; it gets a client-side redirect of the whole page (back
    to the page it came from after logging in) instead.
    """
    plain = login_required(view)

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        htmx = getattr(request, "htmx", None)
        if htmx and not request.user.is_authenticated:
            current = urlsplit(htmx.current_url or "")
            back = current.path + (f"?{current.query}" if current.query else "")
            login = redirect_to_login(back or request.get_full_path(), settings.LOGIN_URL)
            return HttpResponseClientRedirect(login["Location"])
        return plain(request, *args, **kwargs)

    return wrapper


def login_address(request: HttpRequest) -> str | None:
    """The client address login attempts are counted against (``AXES_CLIENT_IP_CALLABLE``).

    The socket's address; behind the TLS proxy (``TASKDESK_BEHIND_TLS_PROXY``), the last entry
    of ``X-Forwarded-For``: the one the proxy added. The entries before it are whatever the
    client sent, so taking one of them would let a client pick a fresh address per attempt.
    """
    if settings.TASKDESK_BEHIND_TLS_PROXY:
        forwarded = str(request.META.get("HTTP_X_FORWARDED_FOR", "")).rsplit(",", 1)[-1].strip()
        if forwarded:
            return forwarded
    address: str | None = request.META.get("REMOTE_ADDR")
    return address


# --- roles ----------------------------------------------------------------------------------
#
# A role is the user's in one tenant (``Membership.role``); what a role may do is a set of
# permissions. The pages and actions ask for a permission in the task's tenant (``may``),
# never for role names. A site can also grant a permission (or a role's group) to a user in
# the admin: it holds in every tenant the user is a member of. Superusers have every
# permission in every tenant.
#
# The permissions to answer, cancel and reconcile are not in the models' Meta: they are rows
# that the data migration ``0004_roles`` creates and ``ensure_roles`` recreates (a test run's
# flush removes groups and rows the models do not declare).

VIEW_TASKS = "tasks_app.view_task"
VIEW_QUESTIONS = "elicitations.view_inputrequest"
ANSWER_QUESTIONS = "elicitations.answer_inputrequest"
CANCEL_TASKS = "tasks_app.cancel_task"
RECONCILE_EFFECTS = "tasks_app.reconcile_effect"
RESEND_WEBHOOKS = "tasks_app.resend_outboxmessage"
VIEW_AUDIT = "tasks_app.view_auditentry"
RERUN_TASKS = "tasks_app.rerun_task"
# Connect an OAuth app to the tenant (it then starts tasks there) and see or revoke the apps
# others connected (the built-in authorization server; docs/clients.md).
CONNECT_APPS = "tasks_app.add_oauthgrant"

# name -> (model, description) of the permissions the roles are made of.
PERMISSIONS: dict[str, tuple[str, str]] = {
    VIEW_TASKS: ("task", "Can view task"),
    VIEW_QUESTIONS: ("inputrequest", "Can view input request"),
    ANSWER_QUESTIONS: ("inputrequest", "Can answer questions in the inbox"),
    CANCEL_TASKS: ("task", "Can request cancellation of tasks"),
    RECONCILE_EFFECTS: ("effect", "Can reconcile effects whose outcome is unknown"),
    RESEND_WEBHOOKS: ("outboxmessage", "Can send a webhook again"),
    VIEW_AUDIT: ("auditentry", "Can view audit entry"),
    RERUN_TASKS: ("task", "Can run a finished task again"),
    CONNECT_APPS: ("oauthgrant", "Can add OAuth grant"),
}
VIEWER, ANSWERER, OPERATOR = "viewer", "answerer", "operator"
ROLES: dict[str, tuple[str, ...]] = {
    VIEWER: (VIEW_TASKS, VIEW_QUESTIONS),
    ANSWERER: (VIEW_TASKS, VIEW_QUESTIONS, ANSWER_QUESTIONS),
    OPERATOR: (
        VIEW_TASKS,
        VIEW_QUESTIONS,
        ANSWER_QUESTIONS,
        CANCEL_TASKS,
        RECONCILE_EFFECTS,
        RESEND_WEBHOOKS,
        VIEW_AUDIT,
        RERUN_TASKS,
        CONNECT_APPS,
    ),
}


def _permission(name: str) -> Any:
    from django.contrib.auth.models import Permission
    from django.contrib.contenttypes.models import ContentType

    app_label, codename = name.split(".")
    model, description = PERMISSIONS[name]
    content_type, _ = ContentType.objects.get_or_create(app_label=app_label, model=model)
    permission, _ = Permission.objects.get_or_create(
        content_type=content_type, codename=codename, defaults={"name": description}
    )
    return permission


def ensure_roles() -> dict[str, Any]:
    """Create the role groups and their permissions if missing; return the groups by role."""
    from django.contrib.auth.models import Group

    groups = {}
    for role, names in ROLES.items():
        group, _ = Group.objects.get_or_create(name=role)
        group.permissions.add(*(_permission(name) for name in names))
        groups[role] = group
    return groups


def grant_role(user: Any, role: str, tenant: Any = None) -> None:
    """Make ROLE the user's role in TENANT (a member of it already), or in every tenant they
    are a member of when TENANT is None. Their roles in other tenants stay as they are."""
    from tasks_app.models import Membership

    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; choose one of {', '.join(ROLES)}")
    ensure_roles()  # the permission rows the role is made of
    memberships = Membership.objects.filter(user=user)
    if tenant is not None:
        memberships = memberships.filter(tenant=tenant)
    memberships.update(role=role)
    forget(user)


def forget(user: Any) -> None:
    """Drop what USER's instance remembers of its roles and permissions (``has_perm`` and
    ``roles_of`` cache them on the instance)."""
    for cache in (
        "_perm_cache",
        "_user_perm_cache",
        "_group_perm_cache",
        "_taskdesk_roles",
        "_taskdesk_client_ids",
    ):
        user.__dict__.pop(cache, None)


def roles_of(user: Any) -> dict[int, str]:
    """USER's role in each tenant they are a member of, by tenant id ("" for none);
    remembered on the user object, which lives for one request."""
    from tasks_app.models import Membership

    cached = user.__dict__.get("_taskdesk_roles")
    if cached is None:
        cached = dict(Membership.objects.filter(user=user.pk).values_list("tenant_id", "role"))
        user.__dict__["_taskdesk_roles"] = cached
    return cached  # type: ignore[no-any-return]


def tenants_where(user: Any, permission: str) -> list[int] | None:
    """Ids of the tenants where USER holds PERMISSION: None for every tenant (a superuser).

    A role holds its permissions in the tenant of the membership; a permission granted to the
    user or a group of theirs in the admin holds in every tenant they are a member of."""
    if not (user.is_authenticated and user.is_active):
        return []
    if user.is_superuser:
        return None
    roles = roles_of(user)
    if user.has_perm(permission):
        return list(roles)
    return [tenant for tenant, role in roles.items() if permission in ROLES.get(role, ())]


def may(user: Any, permission: str, tenant: Any = None) -> bool:
    """Whether USER holds PERMISSION in TENANT (a Tenant or its id), or in some tenant when
    TENANT is None (superusers: always)."""
    tenants = tenants_where(user, permission)
    if tenants is None:
        return True
    return bool(tenants) if tenant is None else _pk(tenant) in tenants


def _pk(tenant: Any) -> int:
    return tenant if isinstance(tenant, int) else int(tenant.pk)
