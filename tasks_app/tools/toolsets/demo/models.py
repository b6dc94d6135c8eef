"""The demo toolset's stand-in for a payment provider."""

from __future__ import annotations

from django.db import models


class DemoRefund(models.Model):
    """The demo toolset's stand-in for a payment provider's refunds (``refund_payment``).

    The unique downstream key is what makes a second refund of one task impossible, however
    the rest of the system failed: the provider refuses a key it has already seen, and counts
    the calls it refused (``refused_calls``), so the calls it got are ``1 + refused_calls``.
    """

    downstream_key = models.CharField(max_length=300, unique=True)
    payment_id = models.CharField(max_length=200)
    amount_cents = models.BigIntegerField()
    reason = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    refused_calls = models.PositiveIntegerField(default=0)

    class Meta:
        # The table it had in tasks_app, kept (migrations tasks_app 0024, demo_toolset 0001).
        db_table = "tasks_app_demorefund"

    def __str__(self) -> str:
        return f"refund {self.pk} of {self.payment_id}"
