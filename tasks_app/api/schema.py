"""The OpenAPI schema's scope (drf-spectacular's ``PREPROCESSING_HOOKS``)."""

from __future__ import annotations

from typing import Any

PREFIX = "/api/"


def only_the_api(endpoints: list[tuple[str, str, str, Any]]) -> list[tuple[str, str, str, Any]]:
    """The endpoints under /api/: /mcp is a DRF view too, with a protocol of its own."""
    return [endpoint for endpoint in endpoints if endpoint[0].startswith(PREFIX)]
