from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from tasks_app import audit, tokens
from tasks_app.models import AuditAction, Client


class Command(BaseCommand):
    help = "Revoke every bearer token of an MCP client."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--client", required=True, help="client name")
        parser.add_argument("--actor", default="manage.py", help="who the audit log names")

    def handle(self, *args: Any, client: str, actor: str, **options: Any) -> None:
        try:
            row = Client.objects.get(name=client)
        except Client.DoesNotExist:
            raise CommandError(f"no client named {client!r}") from None
        with transaction.atomic():
            count = tokens.revoke_all(row)
            audit.record(audit.Who.shell(actor), AuditAction.TOKEN_REVOKE, tenant=row.tenant_id,
                         target=f"client:{row.pk}", client=row.name, tokens=count)  # fmt: skip
        self.stdout.write(f"Revoked {count} token(s) of client {client!r}.")
