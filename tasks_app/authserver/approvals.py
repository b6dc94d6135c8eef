"""What the consent page offers and records: the tenants a person may connect an app to, and
the grant an approval creates or renews, with the tenant's Taskdesk client for the app."""

from __future__ import annotations

import hashlib
from typing import Any

from django.db import transaction
from django.db.models import QuerySet
from django.utils.text import slugify

from tasks_app import audit, operators
from tasks_app.clients import client_get_or_create
from tasks_app.models import AuditAction, Client, OAuthApp, OAuthGrant, Tenant

SCOPE_TEXT = {
    "tasks:call": "Call tools and follow, cancel and read the results of the tasks it starts",
    "tasks:answer": "Answer the questions its tasks ask",
}


def tenants_for(person: Any) -> QuerySet[Tenant]:
    """The tenants PERSON may connect apps to (their role allows it there)."""
    ids = operators.tenants_where(person, operators.CONNECT_APPS)
    tenants = Tenant.objects.order_by("slug")
    return tenants if ids is None else tenants.filter(pk__in=ids)


def client_for(app: OAuthApp, tenant: Tenant) -> Client:
    """The Taskdesk client APP acts as in TENANT: the one an earlier grant made, or a new one
    named after the app (tasks, keys, quotas and the dashboard treat it as any client)."""
    earlier = OAuthGrant.objects.filter(app=app, tenant=tenant).order_by("pk").first()
    if earlier is not None:
        return earlier.client
    digest = hashlib.sha256(f"{app.client_id}\n{tenant.pk}".encode()).hexdigest()[:8]
    name = f"{slugify(app.name)[:60] or 'app'}-{digest}"
    return client_get_or_create(name=name, tenant=tenant.slug)


@transaction.atomic
def approve(*, who: audit.Who, app: OAuthApp, tenant: Tenant, scopes: str) -> OAuthGrant:
    """Record that WHO's person lets APP act for TENANT with SCOPES: renew their live grant
    for it, or create one, with its audit entry."""
    client = client_for(app, tenant)
    live = OAuthGrant.objects.select_for_update().filter(
        app=app, tenant=tenant, person=who.user, revoked_at__isnull=True
    )
    grant = live.first()
    if grant is None:
        grant = OAuthGrant.objects.create(
            person=who.user, tenant=tenant, client=client, app=app, scopes=scopes
        )
    elif grant.scopes != scopes:
        grant.scopes = scopes
        grant.save(update_fields=["scopes"])
    audit.record(who, AuditAction.APP_CONNECT, tenant=tenant, target=f"grant:{grant.pk}",
                 app=app.name, client_id=app.client_id, client=client.name, scopes=scopes)  # fmt: skip
    return grant
