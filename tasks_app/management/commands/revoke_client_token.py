from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from tasks_app import tokens
from tasks_app.models import Client


class Command(BaseCommand):
    help = "Revoke every bearer token of an MCP client."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--client", required=True, help="client name")

    def handle(self, *args: Any, client: str, **options: Any) -> None:
        try:
            row = Client.objects.get(name=client)
        except Client.DoesNotExist:
            raise CommandError(f"no client named {client!r}") from None
        count = tokens.revoke_all(row)
        self.stdout.write(f"Revoked {count} token(s) of client {client!r}.")
