from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from tasks_app import audit, tokens
from tasks_app.clients import ClientTenantMismatch, client_get_or_create
from tasks_app.models import AuditAction


class Command(BaseCommand):
    help = "Create an MCP client if needed and print a new bearer token (last line of output)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--client", required=True, help="client name")
        parser.add_argument("--tenant", required=True, help="tenant slug")
        parser.add_argument("--actor", default="manage.py", help="who the audit log names")
        parser.add_argument(
            "--tools",
            help="comma-separated names of the only tools the client may call, whatever its "
            'token ("": every tool); left as it is when not given',
        )

    def handle(
        self, *args: Any, client: str, tenant: str, actor: str, tools: str | None, **options: Any
    ) -> None:
        try:
            row = client_get_or_create(name=client, tenant=tenant)
        except ClientTenantMismatch as exc:
            raise CommandError(str(exc)) from None
        with transaction.atomic():
            if tools is not None:
                row.allowed_tools = [name.strip() for name in tools.split(",") if name.strip()]
                row.save(update_fields=["allowed_tools"])
            token = tokens.issue(row)
            audit.record(audit.Who.shell(actor), AuditAction.TOKEN_CREATE, tenant=row.tenant_id,
                         target=f"client:{row.pk}", client=row.name, prefix=token[: len(tokens.TOKEN_PREFIX) + 6])  # fmt: skip
        self.stderr.write(
            f"New token for client {row.name!r} in tenant {row.tenant.slug!r}; it is shown once."
        )
        self.stdout.write(token)
