from __future__ import annotations

import shutil
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = (
        "Empty the metrics folder (PROMETHEUS_MULTIPROC_DIR) before Taskdesk's processes on "
        "this host start: the counters of a stopped run would otherwise stay in the totals "
        "and their files would pile up."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        folder = settings.PROMETHEUS_MULTIPROC_DIR
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True, exist_ok=True)
        self.stdout.write(f"emptied {folder}")
