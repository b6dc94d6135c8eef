"""One racing process: ``python -m tests.integration.race_submitter CLIENT KEY START_AT``.

Sets Django up, waits until the wall-clock time START_AT, submits the acceptance tests'
``export`` call with idempotency key KEY for client CLIENT, and prints the receipt as JSON.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")


def main() -> None:
    import django

    django.setup()
    from django.db import connection

    from tasks_app import acceptance
    from tasks_app.models import Client, Era
    from tests.tasks_app.acceptance_tools import EXPORT

    client_name, key, start_at = sys.argv[1], sys.argv[2], float(sys.argv[3])
    client = Client.objects.get(name=client_name)
    connection.ensure_connection()
    time.sleep(max(0.0, start_at - time.time()))
    receipt = acceptance.accept(
        client=client,
        tool=EXPORT,
        arguments={"quarter": "Q1"},
        era=Era.MODERN,
        key=acceptance.IdempotencyKey(key, "header"),
    )
    print(json.dumps({"task": receipt.task.pk, "replayed": receipt.replayed}))


if __name__ == "__main__":
    main()
