from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from tasks_app import webhooks
from tasks_app.models import Client, WebhookEvent


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

    def handle(
        self, *args: Any, client: str, url: str, events: list[str], description: str, **options: Any
    ) -> None:
        try:
            row = Client.objects.get(name=client)
        except Client.DoesNotExist:
            raise CommandError(f"no client named {client!r}") from None
        try:
            endpoint, secret = webhooks.register(
                client=row, url=url, events=events, description=description
            )
        except ValidationError as exc:
            raise CommandError(" ".join(exc.messages)) from None
        self.stderr.write(
            f"Webhook endpoint {endpoint.pk} of client {row.name!r}: {url} "
            f"({', '.join(endpoint.events)}). Its signing secret is shown once."
        )
        self.stdout.write(secret)
