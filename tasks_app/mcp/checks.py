"""System checks for the MCP endpoint's settings."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Tags, Warning, register


@register(Tags.security, deploy=True)
def anonymous_client_check(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    name = settings.TASKDESK_ANONYMOUS_CLIENT
    if not name:
        return []
    return [
        Warning(
            f"TASKDESK_ANONYMOUS_CLIENT is set: requests without a bearer token act as client "
            f"{name!r}, so anyone who can reach /mcp can run tools and see that client's tasks.",
            hint="Unset TASKDESK_ANONYMOUS_CLIENT and give each client a token "
            "(manage.py create_client_token).",
            id="taskdesk.W001",
        )
    ]
