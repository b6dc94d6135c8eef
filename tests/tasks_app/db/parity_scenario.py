"""One scenario that runs every operation of ``tasks_app.db.Backend`` on the database of
DATABASE_URL (a fresh one: it migrates it first) and prints, as JSON, what each operation
returned and the rows the scenario left, normalized so that two databases can be compared
(``test_parity``). Run as ``python -m tests.tasks_app.db.parity_scenario``."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from datetime import UTC, datetime
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

NOW = datetime(2026, 12, 5, 4, 0, 0, tzinfo=UTC)
# A time: only whether it is set. The database's clock sets lease expiries; the rows' own
# times are the worker's (NOW, or the process's clock where the ORM stamps them on SQLite).
TIME = "<time>"


def normalized(value: Any) -> Any:
    from django.db import models

    if isinstance(value, models.Model):
        fields = value._meta.concrete_fields
        return {f.attname: normalized(getattr(value, f.attname)) for f in fields}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: normalized(getattr(value, f.name)) for f in dataclasses.fields(value)} | {
            "type": type(value).__name__
        }
    if isinstance(value, datetime):
        return TIME
    if isinstance(value, (list, tuple)):
        return [normalized(item) for item in value]
    if isinstance(value, dict):
        return {str(key): normalized(item) for key, item in value.items()}
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return normalized(json.loads(value))
        except ValueError:
            return value
    return value


def rows() -> dict[str, Any]:
    """Every row of the tables the operations write, in a stable order."""
    from elicitations.models import InputRequest
    from tasks_app.models import Dispatch, Drainer, JournalEntry, OutboxMessage, Task, TaskEvent

    tables: dict[str, Any] = {}
    for model, order in (
        (Task, "id"),
        (TaskEvent, "id"),
        (Dispatch, "id"),
        (JournalEntry, "id"),
        (Drainer, "name"),
        (OutboxMessage, "id"),
        (InputRequest, "key"),
    ):
        found = [normalized(row) for row in model.objects.order_by(order).values()]
        for row in found:
            if "message_id" in row:  # random
                row["message_id"] = row["message_id"][:4]
        tables[model._meta.db_table] = found
    return tables


def task(client: Any, task_id: str, key: str | None, fingerprint: str = "fp") -> Any:
    from tasks_app.models import Era, Status, Task

    return Task(
        id=task_id, client=client, tool_name="noop", arguments={"n": 1}, fingerprint=fingerprint,
        idempotency_key=key, status=Status.WORKING, era=Era.MODERN, ttl_ms=60_000,
        poll_interval_ms=1000, created_at=NOW, updated_at=NOW, expires_at=NOW,
    )  # fmt: skip


def scenario() -> dict[str, Any]:
    from django.db import transaction

    from elicitations.models import InputRequest
    from tasks_app import db, outbox
    from tasks_app.clients import client_get_or_create
    from tasks_app.models import Drainer, EventKind, Status, WebhookEndpoint

    backend = db.backend()
    alice = client_get_or_create(name="alice", tenant="acme")
    bob = client_get_or_create(name="bob", tenant="globex")
    completed = outbox.WEBHOOK_EVENT_OF[EventKind.COMPLETED].value
    for url, events, enabled in (
        ("https://example.com/hook", [completed], True),
        ("https://example.com/other", ["task.failed"], True),  # not subscribed
        ("https://example.com/off", [completed], False),  # disabled
    ):
        WebhookEndpoint.objects.create(
            client=alice, url=url, secret="s", events=events, enabled=enabled
        )
    returned: dict[str, list[Any]] = {}

    def record(operation: str, value: Any) -> None:
        returned.setdefault(operation, []).append(normalized(value))

    journal = [{"seq": 1, "kind": "step", "name": "s", "outcome": {"ok": True}}]
    accepted = {}
    for name, client, key, fingerprint, steps in (
        ("a", alice, "key-a", "fp", []),
        ("a", alice, "key-a", "fp", []),  # the same call again: a duplicate
        ("a", alice, "key-a", "other", []),  # the same key, another call
        ("b", alice, None, "fp", []),
        ("c", bob, "key-c", "fp", []),
        ("d", alice, None, "fp", journal),
    ):
        new = task(client, f"task-{name}-{len(accepted)}", key, fingerprint)
        result = backend.insert_or_get(new, actor="alice", carrier="header", journal=steps)
        record("insert_or_get", result)
        accepted.setdefault(name, result.task.pk)
    a, b, c, d = accepted["a"], accepted["b"], accepted["c"], accepted["d"]

    record("can_stand_by", backend.can_stand_by)  # differs by design; see test_parity
    claim = backend.claim(task_id=a, dispatch_id=1, owner="w1", now=NOW, lease_seconds=30)
    record("claim", claim)
    assert claim is not None
    record("claim", backend.claim(task_id=a, dispatch_id=1, owner="w2", now=NOW, lease_seconds=30))
    record(
        "claim", backend.claim(task_id=d, dispatch_id=None, owner="w2", now=NOW, lease_seconds=30)
    )

    looked = backend.claim_next(owner="w3", now=NOW, lease_seconds=30, drainer="d1", window=30)
    record("claim_next", dataclasses.replace(looked, oldest=None, newest=None))
    assert looked.taken is not None and looked.taken.claim is not None
    taken = looked.taken.claim.task
    record("drained", backend.drained())
    record("hand_off", backend.hand_off("9 task-x"))
    try:
        backend.stand_by("d2", channel="parity", seconds=30)
    except NotImplementedError:
        record("stand_by", "NotImplementedError")
    else:
        record(
            "stand_by", list(Drainer.objects.filter(name="d2").values_list("standby", "channel"))
        )
        backend.withdraw("d2")

    record("renew", backend.renew(task_id=a, owner="w1", leg=claim.task.leg, lease_seconds=60))
    record("renew", backend.renew(task_id=a, owner="w1", leg=claim.task.leg + 1, lease_seconds=60))
    record("renew", backend.renew(task_id=a, owner="w9", leg=claim.task.leg, lease_seconds=60))
    record("over_share", backend.over_share(task_id=taken.pk, tenant_id=alice.tenant_id, share=0.5))
    record("over_share", backend.over_share(task_id=a, tenant_id=alice.tenant_id, share=0.9))
    with transaction.atomic():
        record("lock_leased", backend.lock_leased(task_id=a, owner="w1", leg=claim.task.leg))
        record("lock_leased", backend.lock_leased(task_id=a, owner="w9", leg=claim.task.leg))

    # What task A still asks when it ends: the two pending questions are closed, in key
    # order; the answered one stays as it is.
    for key, status in (("q-b", "pending"), ("q-a", "pending"), ("q-c", "answered")):
        InputRequest.objects.create(
            task_id=a, key=key, ask_key=key, message=key, requested_schema={}, status=status
        )
    ending = db.Ending(
        task_id=a, status=Status.COMPLETED, kind=EventKind.COMPLETED, owner="w1",
        leg=claim.task.leg, actor="w1", fields={"result": {"content": []}, "status_message": "ok"},
        detail={"why": "done"}, now=NOW, grow=7,
    )  # fmt: skip
    record("end_leased", backend.end_leased(ending))
    record("end_leased", backend.end_leased(ending))  # the lease is gone

    record("task_for_client", backend.task_for_client(alice.pk, a))
    record("task_for_client", backend.task_for_client(bob.pk, a))

    with transaction.atomic():
        record("release", backend.release(task_id=taken.pk, owner="w3", now=NOW, leg=taken.leg))
        record("release", backend.release(task_id=taken.pk, owner="w3", now=NOW, leg=taken.leg))
        record("release", backend.release(task_id=d, owner=None, now=NOW))

    # A lease that expired at once.
    expired = backend.claim(task_id=c, dispatch_id=None, owner="w4", now=NOW, lease_seconds=-10)
    record("claim", expired)
    record("expired_leases", backend.expired_leases(status=Status.WORKING, limit=10))
    with transaction.atomic():
        record(
            "expire_lease",
            backend.expire_lease(task_id=c, status=Status.WORKING, owner="w4", now=NOW),
        )
        record(
            "expire_lease",
            backend.expire_lease(task_id=c, status=Status.WORKING, owner="w4", now=NOW),
        )

    # A drainer gone for two minutes is forgotten; a fresh one is withdrawn.
    backend.claim_next(owner="w5", now=NOW, lease_seconds=30, drainer="gone", window=-120)
    record("forget_drainers", backend.forget_drainers(older_than=60))
    backend.withdraw("d1")
    record("withdraw", backend.drained())
    return {"returned": returned, "rows": rows(), "b": b}


def main() -> None:
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    json.dump(scenario(), sys.stdout, indent=1, sort_keys=True, default=str)


if __name__ == "__main__":
    main()
