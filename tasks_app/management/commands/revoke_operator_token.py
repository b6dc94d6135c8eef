from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from tasks_app import audit, tokens
from tasks_app.models import AuditAction


class Command(BaseCommand):
    help = "Revoke a personal operator token (--name), or every token of the user (--all)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", required=True)
        which = parser.add_mutually_exclusive_group(required=True)
        which.add_argument("--name", help="the token's name")
        which.add_argument("--all", action="store_true", help="every live token of the user")
        parser.add_argument("--actor", default="manage.py", help="who the audit log names")

    def handle(
        self, *args: Any, username: str, name: str | None, actor: str, **options: Any
    ) -> None:
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no user named {username!r}")
        who = audit.Who.shell(actor)
        with transaction.atomic():
            revoked = tokens.revoke_operator_tokens(user, name=name)
            for row in revoked:
                audit.record(who, AuditAction.OPERATOR_TOKEN_REVOKE, target=f"user:{username}",
                             name=row.name, prefix=row.prefix)  # fmt: skip
        if name is not None and not revoked:
            raise CommandError(f"{username!r} has no live token named {name!r}")
        self.stdout.write(f"Revoked {len(revoked)} operator token(s) of {username!r}.")
