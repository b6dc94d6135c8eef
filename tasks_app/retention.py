"""How long tasks (and so their idempotency keys) are kept."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from tasks_app.models import Task


def expiry_for(ttl_ms: int | None) -> timedelta | None:
    """The purge moment relative to creation: TTL plus the grace period (None = never)."""
    if ttl_ms is None:
        return None
    return timedelta(milliseconds=ttl_ms) + timedelta(seconds=settings.TASKDESK_PURGE_GRACE_SECONDS)


def purge_expired(*, batch: int = 1000) -> int:
    """Delete expired tasks; their events, journal, effects and input requests cascade."""
    total = 0
    while True:
        ids = list(
            Task.objects.filter(expires_at__lte=timezone.now()).values_list("pk", flat=True)[:batch]
        )
        if not ids:
            return total
        Task.objects.filter(pk__in=ids).delete()
        total += len(ids)
