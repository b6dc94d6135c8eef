from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from tasks_app import tokens
from tasks_app.clients import ClientTenantMismatch, client_get_or_create


class Command(BaseCommand):
    help = "Create an MCP client if needed and print a new bearer token (last line of output)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--client", required=True, help="client name")
        parser.add_argument("--tenant", required=True, help="tenant slug")

    def handle(self, *args: Any, client: str, tenant: str, **options: Any) -> None:
        try:
            row = client_get_or_create(name=client, tenant=tenant)
        except ClientTenantMismatch as exc:
            raise CommandError(str(exc)) from None
        token = tokens.issue(row)
        self.stderr.write(
            f"New token for client {row.name!r} in tenant {row.tenant.slug!r}; it is shown once."
        )
        self.stdout.write(token)
