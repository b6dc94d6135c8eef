from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from tasks_app import audit, tokens
from tasks_app.models import AuditAction


class Command(BaseCommand):
    help = (
        "Print a new personal operator token for /api/ (last line of output): it acts as the "
        "user, with the user's roles. It is shown once; only its hash is kept."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", required=True, help="the operator it acts as")
        parser.add_argument("--name", required=True, help="what it is for, e.g. 'ci'")
        parser.add_argument("--actor", default="manage.py", help="who the audit log names")

    def handle(self, *args: Any, username: str, name: str, actor: str, **options: Any) -> None:
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no user named {username!r} (see: manage.py create_operator)")
        if not user.is_active:
            raise CommandError(f"user {username!r} is inactive")
        name = name.strip()
        if not name or len(name) > 100:
            raise CommandError("--name must be 1 to 100 characters")
        try:
            with transaction.atomic():
                row, token = tokens.issue_operator_token(user, name)
                audit.record(audit.Who.shell(actor), AuditAction.OPERATOR_TOKEN_CREATE,
                             target=f"user:{username}", name=name, prefix=row.prefix)  # fmt: skip
        except tokens.TokenNameTaken as exc:
            raise CommandError(f"{exc}: choose another name, or revoke it first") from None
        self.stderr.write(f"New operator token {name!r} of {username!r}; it is shown once.")
        self.stdout.write(token)
