"""Tenants, their members, and the MCP clients with their tokens."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Tenant(models.Model):
    """A group of MCP clients and of the operators who may see their tasks."""

    slug = models.SlugField(max_length=100, unique=True)
    members = models.ManyToManyField(
        settings.AUTH_USER_MODEL, blank=True, related_name="tenants", through="Membership"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    """A user in a tenant, with their role there (``tasks_app.operators.ROLES``): a user can be
    an operator in one tenant and a viewer in another. No role: a member who sees nothing."""

    class Role(models.TextChoices):
        NONE = "", "no role"
        VIEWER = "viewer"
        ANSWERER = "answerer"
        OPERATOR = "operator"

    # The table of the many-to-many field this model took over (roles came later).
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=20, choices=Role.choices, default="", blank=True)

    class Meta:
        db_table = "tasks_app_tenant_members"
        unique_together = [("tenant", "user")]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant}" + (f" ({self.role})" if self.role else "")


class Client(models.Model):
    """An MCP caller (principal). Tasks and idempotency keys are scoped to it."""

    name = models.CharField(max_length=100, unique=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="clients")
    created_at = models.DateTimeField(auto_now_add=True)
    # Names of the tools this client may call; empty: every tool (an operator narrows a client
    # in the admin; OAuth tokens acting as the client are narrowed the same way).
    allowed_tools = models.JSONField(default=list, blank=True)

    def __str__(self) -> str:
        return self.name


class ClientToken(models.Model):
    """A bearer token of a client. Only a keyed hash is stored; the token is shown once."""

    client = models.ForeignKey(Client, on_delete=models.CASCADE, related_name="tokens")
    token_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12, help_text="First characters, to tell tokens apart")
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.client})"
