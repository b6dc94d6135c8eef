from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from tasks_app import tokens
from tasks_app.clients import client_get_or_create


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


class Command(BaseCommand):
    help = (
        "Create the operator superuser and the demo MCP client on first run, then print the "
        "MCP endpoint, the dashboard and the demo token."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        with transaction.atomic():
            password_line = self._ensure_operator()
            demo_token = self._ensure_demo_client()
        base = settings.TASKDESK_PUBLIC_URL.rstrip("/")
        lines = [
            "",
            "Taskdesk is starting.",
            f"  MCP endpoint : {base}/mcp",
            f"  Dashboard    : {base}/tasks/",
            f"  Inbox        : {base}/inbox/",
            f"  Health       : {base}/healthz",
            f"  Demo token   : {demo_token}",
        ]
        if password_line:
            lines.append(password_line)
        lines += [
            "",
            "  Claude Code  : claude mcp add --transport http taskdesk "
            f"{base}/mcp --header 'Authorization: Bearer {demo_token}'",
            "",
        ]
        self.stdout.write("\n".join(lines))

    def _ensure_operator(self) -> str:
        User = get_user_model()
        if User.objects.filter(is_superuser=True).exists():
            return ""
        username = os.environ.get("DJANGO_SUPERUSER_USERNAME") or "operator"
        password = os.environ.get("DJANGO_SUPERUSER_PASSWORD")
        email = os.environ.get("DJANGO_SUPERUSER_EMAIL", "")
        generated = not password
        password = password or secrets.token_urlsafe(12)
        user = User.objects.create_superuser(username=username, email=email, password=password)
        client = client_get_or_create(name="demo", tenant="demo")
        client.tenant.members.add(user)
        if generated:
            return f"  Operator     : {username} / {password}   (shown once; change it in /admin/)"
        return f"  Operator     : {username} (password from DJANGO_SUPERUSER_PASSWORD)"

    def _ensure_demo_client(self) -> str:
        client = client_get_or_create(name="demo", tenant="demo")
        saved = settings.VAR_DIR / "demo_token"
        if saved.exists():
            token = saved.read_text().strip()
            if tokens.client_for_token(token) == client:
                return token
        token = tokens.issue(client)
        _write_private(saved, token + "\n")
        return token
