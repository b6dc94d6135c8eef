"""The built-in OAuth authorization server's records: the apps (OAuth clients), the grants
people approved, the authorization codes and tokens issued on them, and which app and person
started a task.

Codes and tokens are stored only as keyed hashes (``tasks_app.oauth.builtin``), as the
static client tokens are: a copy of the database holds nothing a caller could present.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from tasks_app.models.clients import Client, Tenant
from tasks_app.models.tasks import Task


class OAuthApp(models.Model):
    """An OAuth client of the built-in authorization server: an MCP client application such
    as a desktop assistant or an IDE. It becomes a Taskdesk ``Client`` in each tenant a
    person connects it to (``OAuthGrant.client``)."""

    class Kind(models.TextChoices):
        REGISTERED = "registered", "registered by an administrator"
        DYNAMIC = "dynamic", "registered itself (RFC 7591)"
        DOCUMENT = "document", "client ID metadata document"

    # An https URL for a client ID metadata document; a random string otherwise.
    client_id = models.CharField(max_length=1000, unique=True)
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=20, choices=Kind.choices, default=Kind.REGISTERED)
    redirect_uris = models.JSONField(default=list, blank=True)
    # Empty for public clients (token_endpoint_auth_method "none"): every dynamically
    # registered app and every metadata document app is one.
    client_secret_hash = models.CharField(max_length=64, blank=True)
    token_endpoint_auth_method = models.CharField(max_length=40, default="none")
    client_uri = models.URLField(max_length=1000, blank=True)
    # A metadata document app: when its document was last fetched, and until when that copy
    # is used (its Cache-Control max-age, within bounds).
    fetched_at = models.DateTimeField(null=True, blank=True)
    fresh_until = models.DateTimeField(null=True, blank=True)
    # An administrator can stop an app: it can no longer be approved or get tokens.
    disabled = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = "OAuth app"

    def __str__(self) -> str:
        return self.name


class OAuthGrant(models.Model):
    """A person's approval of an app acting for one of their tenants, as that tenant's
    Taskdesk client. Its tokens work while it is not revoked; revoking it stops them all."""

    person = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="oauth_grants"
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="oauth_grants")
    client = models.ForeignKey(Client, on_delete=models.CASCADE, related_name="oauth_grants")
    app = models.ForeignKey(OAuthApp, on_delete=models.CASCADE, related_name="grants")
    # Space-separated, as OAuth writes them (tasks_app.oauth.access.SCOPES).
    scopes = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)
    # Written at most once a minute (tasks_app.oauth.builtin.LAST_USED_EVERY).
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "OAuth grant"
        constraints = [
            # Approving an app again for the same tenant renews the live grant.
            models.UniqueConstraint(
                fields=["app", "tenant", "person"],
                condition=Q(revoked_at__isnull=True),
                name="oauth_grant_live_once",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.app} for {self.person} in {self.tenant}"

    @property
    def scope_list(self) -> list[str]:
        return self.scopes.split()


class OAuthCode(models.Model):
    """An authorization code: single use, short-lived, bound to its redirect URI, its PKCE
    challenge and its resource."""

    code_hash = models.CharField(max_length=64, unique=True)
    grant = models.ForeignKey(OAuthGrant, on_delete=models.CASCADE, related_name="codes")
    redirect_uri = models.CharField(max_length=1000)
    scopes = models.CharField(max_length=200)
    resource = models.CharField(max_length=1000)
    code_challenge = models.CharField(max_length=128)
    code_challenge_method = models.CharField(max_length=10, default="S256")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    # Set by the exchange (compare-and-set): a second exchange revokes what the first issued.
    used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"code of {self.grant}"


class OAuthToken(models.Model):
    """An access token with its refresh token. A refresh makes a new row and marks this one
    refreshed; every row of one code exchange shares its ``family``, so a refresh token used
    twice revokes the family."""

    access_hash = models.CharField(max_length=64, unique=True)
    # NULL when no refresh token was issued; unique where set.
    refresh_hash = models.CharField(max_length=64, unique=True, null=True, blank=True)
    grant = models.ForeignKey(OAuthGrant, on_delete=models.CASCADE, related_name="tokens")
    family = models.CharField(max_length=32, db_index=True)
    scopes = models.CharField(max_length=200)
    # The canonical URI of the MCP endpoint the token is for (RFC 8707), checked on every use.
    resource = models.CharField(max_length=1000)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    refresh_expires_at = models.DateTimeField(null=True, blank=True)
    # The refresh token was exchanged for a new pair (rotation): it is spent.
    refreshed_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "OAuth token"

    def __str__(self) -> str:
        return f"token of {self.grant}"


class TaskOrigin(models.Model):
    """The app and the person that started a task through the built-in server's tokens (or
    an external issuer's): a row only for such tasks, written in the acceptance's
    transaction, so a static-token task costs nothing more."""

    task = models.OneToOneField(
        Task, on_delete=models.CASCADE, primary_key=True, related_name="origin"
    )
    app = models.CharField(max_length=200)
    person = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_index=False,
    )
    # The person's name as it was (the user may be renamed or deleted later).
    person_name = models.CharField(max_length=150, blank=True)
    grant = models.ForeignKey(
        OAuthGrant,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_index=False,
    )

    def __str__(self) -> str:
        return f"{self.task_id} via {self.app}"
