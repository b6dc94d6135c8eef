"""Serializer fields the API's serializers share."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers


class IsoDateTimeField(serializers.DateTimeField):
    """A moment as ``datetime.isoformat()`` writes it, as the rows of ``listing.task_record``
    and the audit log's export carry theirs (not DRF's ``Z`` for UTC)."""

    def to_representation(self, value: Any) -> Any:
        return value.isoformat() if hasattr(value, "isoformat") else value
