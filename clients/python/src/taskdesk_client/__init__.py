"""taskdesk-client: call Taskdesk tools so that no receipt is ever lost.

    from taskdesk_client import Client

    with Client("http://127.0.0.1:8000/mcp", token="tdk_...") as client:
        handle = client.submit("export_report", {"quarter": "Q3"})  # journaled, then sent
        print(handle.task_id, handle.result())

After a crash, ``Client(...).resume()`` (or ``taskdesk resume``) resends what the journal holds
without a receipt, each with its own idempotency key: every submission ends as one task.
"""

from __future__ import annotations

from taskdesk_client.client import (
    Backoff,
    Client,
    Handle,
    Refused,
    Resumed,
    TaskCancelled,
    TaskdeskError,
    TaskFailed,
    Unreachable,
)
from taskdesk_client.journal import Entry, Journal, KeyReused

__all__ = [
    "Backoff",
    "Client",
    "Entry",
    "Handle",
    "Journal",
    "KeyReused",
    "Refused",
    "Resumed",
    "TaskCancelled",
    "TaskFailed",
    "TaskdeskError",
    "Unreachable",
]
