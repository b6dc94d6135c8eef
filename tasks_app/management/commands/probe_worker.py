"""`manage.py probe_worker`: exit 0 while a worker node (or beat) is alive, 1 when it is not;
for an exec probe (Kubernetes' livenessProbe of a worker or control pod) or a supervisor.

Alive means its heartbeat row is fresh: the worker's main process writes it every
TASKDESK_HEARTBEAT_SECONDS while it runs, and beat's is written by the heartbeat job a
control worker runs. A node that stopped, froze (SIGSTOP) or lost the database goes stale
after TASKDESK_WORKER_STALE_SECONDS.
"""

from __future__ import annotations

import socket
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError
from django.utils import timezone

from tasks_app.health import heartbeat_stale
from tasks_app.models import WorkerHeartbeat


class Command(BaseCommand):
    help = "Exit 0 while a worker node (or beat) has a fresh heartbeat, 1 otherwise."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--node",
            default="",
            help="the worker's node name as Celery names it (worker@HOST, control@HOST); "
            "default: worker@ this host",
        )
        parser.add_argument(
            "--beat",
            action="store_true",
            help="probe beat instead: the newest row of its heartbeat job, which beat sends "
            "and a control worker runs",
        )

    def handle(self, *args: Any, node: str, beat: bool, **options: Any) -> None:
        name = "beat" if beat else node or f"worker@{socket.gethostname()}"
        try:
            if beat:  # written by whichever control worker ran the job: the newest counts
                seen = WorkerHeartbeat.newest_by_role()[WorkerHeartbeat.BEAT]
            else:
                seen = (
                    WorkerHeartbeat.objects.filter(hostname=name)
                    .values_list("seen_at", flat=True)
                    .first()
                )
        except DatabaseError as exc:
            raise CommandError(f"cannot read the heartbeats: {exc}") from None
        if seen is None:
            raise CommandError(f"{name}: no heartbeat yet")
        age = (timezone.now() - seen).total_seconds()
        if heartbeat_stale(age):
            raise CommandError(f"{name}: last heartbeat {age:.0f} s ago")
        self.stdout.write(f"{name}: heartbeat {age:.0f} s ago")
