from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from tasks_app import audit, webhooks
from tasks_app.models import AuditAction, Client, WebhookEvent


class Command(BaseCommand):
    help = (
        "Register a webhook endpoint of a client and print its signing secret (last line of "
        "output; shown once)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--client", required=True, help="client name")
        parser.add_argument("--url", required=True, help="https URL of the receiver")
        parser.add_argument(
            "--events",
            required=True,
            nargs="+",
            choices=WebhookEvent.values,
            metavar="EVENT",
            help=f"events to send: {', '.join(WebhookEvent.values)}",
        )
        parser.add_argument("--description", default="")
        parser.add_argument("--actor", default="manage.py", help="who the audit log names")

    def handle(
        self,
        *args: Any,
        client: str,
        url: str,
        events: list[str],
        description: str,
        actor: str,
        **options: Any,
    ) -> None:
        try:
            row = Client.objects.get(name=client)
        except Client.DoesNotExist:
            raise CommandError(f"no client named {client!r}") from None
        try:
            with transaction.atomic():
                endpoint, secret = webhooks.register(
                    client=row, url=url, events=events, description=description
                )
                audit.record(audit.Who.shell(actor), AuditAction.WEBHOOK_ADD,
                             tenant=row.tenant_id, target=f"client:{row.pk}", url=url,
                             events=list(endpoint.events), endpoint=endpoint.pk)  # fmt: skip
        except ValidationError as exc:
            raise CommandError(" ".join(exc.messages)) from None
        self.stderr.write(
            f"Webhook endpoint {endpoint.pk} of client {row.name!r}: {url} "
            f"({', '.join(endpoint.events)}). Its signing secret is shown once."
        )
        self.stdout.write(secret)
