"""Personal operator tokens: an operator's bearer token for the operator API (/api/)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q


class OperatorToken(models.Model):
    """A bearer token that acts as its user on /api/, with that user's roles. Only a keyed
    hash is stored (``tasks_app.tokens``); the token is shown once, when it is made. A
    revoked token stays revoked (and stays listed, for the record)."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="operator_tokens"
    )
    name = models.CharField(max_length=100, help_text="What the token is for, e.g. 'ci'")
    token_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12, help_text="First characters, to tell tokens apart")
    created_at = models.DateTimeField(auto_now_add=True)
    # Written at most once a minute per token (tokens.LAST_USED_EVERY), not on every request.
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # `manage.py revoke_operator_token --username U --name N` names one live token.
            models.UniqueConstraint(
                fields=["user", "name"],
                condition=Q(revoked_at__isnull=True),
                name="operator_token_live_name",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name})"
