"""``manage.py export_purged_tasks``: the archive of purged tasks as CSV or JSON lines."""

from __future__ import annotations

import csv
import json
from datetime import UTC, datetime
from typing import IO, Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.dateparse import parse_datetime

from tasks_app.models import PurgedTask

FIELDS = (
    "task_id",
    "idempotency_key",
    "client",
    "client_id",
    "tool",
    "outcome",
    "created_at",
    "finished_at",
    "purged_at",
)


def _line(row: PurgedTask) -> dict[str, Any]:
    def at(value: datetime | None) -> str:
        return value.isoformat() if value else ""

    return {
        "task_id": row.task_id,
        "idempotency_key": row.idempotency_key or "",
        "client": row.client_name,
        "client_id": row.client_id,
        "tool": row.tool_name,
        "outcome": row.outcome,
        "created_at": at(row.created_at),
        "finished_at": at(row.finished_at),
        "purged_at": at(row.purged_at),
    }


class Command(BaseCommand):
    help = (
        "Export the archive of purged tasks (id, idempotency key, client, outcome), oldest "
        "purge first, as CSV (the default) or JSON lines."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--format", choices=["csv", "jsonl"], default="csv")
        parser.add_argument("--client", help="only this client's tasks (client name)")
        parser.add_argument(
            "--since", help="only tasks purged at or after this ISO 8601 time (UTC if no zone)"
        )
        parser.add_argument("--output", help="write to this file instead of standard output")

    def handle(self, *args: Any, **options: Any) -> None:
        rows = PurgedTask.objects.order_by("purged_at", "id")
        if options["client"]:
            rows = rows.filter(client_name=options["client"])
        if options["since"]:
            since = parse_datetime(options["since"])
            if since is None:
                raise CommandError(
                    f"--since must be an ISO 8601 time such as 2026-12-01T00:00:00Z, "
                    f"not {options['since']!r}"
                )
            if since.tzinfo is None:
                since = since.replace(tzinfo=UTC)
            rows = rows.filter(purged_at__gte=since)
        if options["output"]:
            try:
                with open(options["output"], "w", newline="", encoding="utf-8") as out:
                    count = self._write(rows, out, options["format"])
            except OSError as exc:
                raise CommandError(f"cannot write {options['output']}: {exc}") from None
            self.stderr.write(f"Exported {count} purged task(s) to {options['output']}.")
        else:
            self._write(rows, self.stdout, options["format"])

    def _write(self, rows: Any, out: IO[str] | Any, fmt: str) -> int:
        # OutputWrapper adds a newline to lines that lack one; every line here has one.
        count = 0
        if fmt == "csv":
            writer = csv.DictWriter(out, fieldnames=FIELDS, lineterminator="\n")
            writer.writeheader()
            for row in rows.iterator():
                writer.writerow(_line(row))
                count += 1
        else:
            for row in rows.iterator():
                out.write(json.dumps(_line(row)) + "\n")
                count += 1
        return count
