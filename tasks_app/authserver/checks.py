"""The built-in authorization server's deploy checks (``manage.py check --deploy``)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Tags, Warning, register


@register(Tags.security, deploy=True)
def loopback_clients_check(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    if not settings.TASKDESK_OAUTH_ALLOW_LOOPBACK_CLIENTS:
        return []
    return [
        Warning(
            "TASKDESK_OAUTH_ALLOW_LOOPBACK_CLIENTS is on: the authorization server fetches "
            "client metadata documents from this host's loopback addresses, over http too.",
            hint="Unset it outside tests and local development.",
            id="taskdesk.W002",
        )
    ]
