"""Creating clients and tenants (used by the management commands and the anonymous mode)."""

from __future__ import annotations

from django.db import IntegrityError, transaction

from tasks_app.models import Client, Tenant


class ClientTenantMismatch(Exception):
    pass


def client_get_or_create(*, name: str, tenant: str) -> Client:
    """Return client NAME, creating it (and tenant TENANT) if needed.

    Raise ClientTenantMismatch if the client already exists in another tenant.
    """
    try:
        with transaction.atomic():
            tenant_row, _ = Tenant.objects.get_or_create(slug=tenant)
            client, _ = Client.objects.get_or_create(name=name, defaults={"tenant": tenant_row})
    except IntegrityError:
        # A concurrent first use created it between our read and insert.
        client = Client.objects.get(name=name)
    if client.tenant.slug != tenant:
        raise ClientTenantMismatch(
            f"client {name!r} already exists in tenant {client.tenant.slug!r}, not {tenant!r}"
        )
    return client
