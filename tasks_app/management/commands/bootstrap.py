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

# Where the first start keeps what it generated, readable by its owner only (mode 600).
DEMO_TOKEN_FILE = "demo_token"
OPERATOR_PASSWORD_FILE = "operator_password"


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def _shown(path: Path) -> str:
    """PATH as the banner names it: relative to the current folder when it is inside it
    (`make run` runs from the checkout, so ``var/operator_password``), absolute otherwise."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path.resolve())


class Command(BaseCommand):
    help = (
        "Create the operator superuser and the demo MCP client on first run, then print the "
        "MCP endpoint, the pages, the demo token and where the operator's password is."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        base = settings.TASKDESK_PUBLIC_URL.rstrip("/")
        with transaction.atomic():
            operator_lines = self._ensure_operator(base)
            demo_token = self._ensure_demo_client()
        token_file = _shown(settings.VAR_DIR / DEMO_TOKEN_FILE)
        # Printed on every start, before the processes' own start-up lines: each line says
        # where to find what it names again (a file under var/), not only what it was.
        lines = [
            "",
            "Taskdesk is starting.",
            f"  MCP endpoint : {base}/mcp",
            f"  Dashboard    : {base}/tasks/",
            f"  Inbox        : {base}/inbox/",
            f"  Health       : {base}/healthz",
            f"  Demo token   : {demo_token}   (kept in {token_file})",
            *operator_lines,
            "",
            "  Claude Code  : claude mcp add --transport http taskdesk "
            f"{base}/mcp --header 'Authorization: Bearer {demo_token}'",
            "",
        ]
        self.stdout.write("\n".join(lines))

    def _ensure_operator(self, base: str) -> list[str]:
        """Create the operator on the first start; return the banner's lines about it."""
        User = get_user_model()
        username = os.environ.get("DJANGO_SUPERUSER_USERNAME") or "operator"
        saved = settings.VAR_DIR / OPERATOR_PASSWORD_FILE
        user = (
            User.objects.filter(is_superuser=True, username=username).first()
            or User.objects.filter(is_superuser=True).order_by("pk").first()
        )
        if user is None:
            password = os.environ.get("DJANGO_SUPERUSER_PASSWORD")
            # An address of its own even when none is given: the messages about questions
            # waiting in the inbox go to it (with no EMAIL_URL, files in var/mail/).
            email = os.environ.get("DJANGO_SUPERUSER_EMAIL") or f"{username}@localhost"
            generated = not password
            password = password or secrets.token_urlsafe(12)
            user = User.objects.create_superuser(username=username, email=email, password=password)
            client = client_get_or_create(name="demo", tenant="demo")
            client.tenant.members.add(user)
            if not generated:
                saved.unlink(missing_ok=True)  # another database's operator
                return [f"  Operator     : {username} (password from DJANGO_SUPERUSER_PASSWORD)"]
            _write_private(saved, password + "\n")
        elif saved.exists() and not user.check_password(saved.read_text().strip()):
            # Changed since it was generated (in the admin, or with changepassword): the file
            # would only mislead.
            saved.unlink()
        name = user.get_username()
        if saved.exists():
            return [
                f"  Operator     : {name}, password in {_shown(saved)}",
                f"                 change it at {base}/admin/password_change/",
            ]
        return [
            f"  Operator     : {name} (password not kept by Taskdesk)",
            f"                 set a new one with: python manage.py changepassword {name}",
        ]

    def _ensure_demo_client(self) -> str:
        client = client_get_or_create(name="demo", tenant="demo")
        saved = settings.VAR_DIR / DEMO_TOKEN_FILE
        if saved.exists():
            token = saved.read_text().strip()
            if tokens.client_for_token(token) == client:
                return token
        token = tokens.issue(client)
        _write_private(saved, token + "\n")
        return token
