"""Accepting a ``tools/call`` as a durable task: idempotency keys, fingerprints, receipts.

``accept`` is the one entry point the MCP handlers of every protocol era call, once per
``tools/call``. They resolve the idempotency key from its wire carriers
(``tasks_app.mcp.keys``) and pass it as an ``IdempotencyKey``; ``accept`` validates and
normalizes the arguments, fingerprints them, and commits the task row, its first event and
its dispatch record (``tasks_app.db``) before it returns the receipt. A retry with the same
key gets the original task back.

Concurrency is decided by the partial unique constraint on (client, idempotency_key): the
loser of a race never inserts a second row, it reads the winner's. There is no
read-then-insert window. docs/idempotency.md describes the rules for clients.

A client may have at most ``TASKDESK_MAX_ACTIVE_TASKS_PER_CLIENT`` tasks that have not ended
(``ActiveTaskLimit``). A replay of a key the client already used is never refused by it:
it creates nothing. The count is read before the insert, so clients racing at the limit may
pass it by the number of their concurrent calls. Reading it costs the database a look at up
to the limit's number of index entries, so a web process that found a client far below its
limit trusts that for a while (``_ActiveCounts``); near the limit it counts on every call.

The bytes a client's kept tasks hold are bounded by ``TASKDESK_MAX_STORED_BYTES_PER_CLIENT``
(``StorageQuota``), with a figure that is recounted now and then, not on every call
(``tasks_app.storage`` says how, and how far a client can pass it); a replay is never
refused by it either.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import rfc8785
from django.conf import settings
from django.utils import timezone

from tasks_app import db, dispatch, metrics, retention, storage, tracing
from tasks_app.models import ACTIVE_STATUSES, Client, Status, Task, TaskOrigin
from tasks_app.tools import InvalidArguments, ToolSpec

# --- errors ------------------------------------------------------------------------------


class AcceptanceError(Exception):
    """A call that cannot be accepted: a JSON-RPC -32602 (invalid params), or the ``code``
    a subclass sets (-32000 for a limit or a quota)."""

    code = -32602

    def __init__(self, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.data = data


class InvalidIdempotencyKey(AcceptanceError):
    pass


class ConflictingKeyCarriers(AcceptanceError):
    pass


class IdempotencyKeyReused(AcceptanceError):
    pass


class IdempotencyKeyRequired(AcceptanceError):
    pass


class ActiveTaskLimit(AcceptanceError):
    """The client has as many unfinished tasks as it may have (the transport answers 429)."""

    code = -32000

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"Too many active tasks: this client already has {limit} tasks that have not "
            "ended (TASKDESK_MAX_ACTIVE_TASKS_PER_CLIENT); wait for some to end, or cancel "
            "some, then send the call again",
            {"reason": "active_task_limit", "limit": limit},
        )
        self.limit = limit


class StorageQuota(AcceptanceError):
    """The client's kept tasks hold as many bytes as they may (the transport answers 429)."""

    code = -32000

    def __init__(self, stored: int, limit: int) -> None:
        super().__init__(
            f"Storage quota reached: this client's kept tasks hold {stored} bytes of "
            f"arguments and results, and it may keep {limit} "
            "(TASKDESK_MAX_STORED_BYTES_PER_CLIENT); the room is freed as its tasks are "
            "purged after their time to live (ttlMs)",
            {"reason": "storage_quota", "bytes": stored, "limit": limit},
        )
        self.stored = stored
        self.limit = limit


class ArgumentsTooLarge(AcceptanceError):
    """The arguments are larger than a task may keep (``TASKDESK_MAX_ARGUMENT_BYTES``)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"The arguments are {size} bytes of JSON; a task keeps at most {limit} "
            "(TASKDESK_MAX_ARGUMENT_BYTES): pass a reference to large data instead",
            {"reason": "arguments_too_large", "bytes": size, "limit": limit},
        )


class InvalidToolArguments(AcceptanceError, InvalidArguments):
    """The arguments do not fit the tool's input schema (or cannot be fingerprinted)."""


# --- keys and receipts ------------------------------------------------------------------


@dataclass(frozen=True)
class IdempotencyKey:
    """A caller's idempotency key, and the carriers it came in (for the timeline)."""

    value: str
    carrier: str


@dataclass(frozen=True)
class StartedBy:
    """The OAuth app (and the person who connected it) behind a call, when its token came
    from an authorization server: written with the task it starts (``TaskOrigin``)."""

    app: str
    person_id: int | None = None
    person_name: str = ""
    grant_id: int | None = None


@dataclass(frozen=True)
class Receipt:
    task: Task
    replayed: bool
    key: str | None
    carrier: str | None


# --- fingerprints ------------------------------------------------------------------------


def digest(value: Any) -> str:
    """SHA-256 (hex) of the RFC 8785 canonical JSON of VALUE: equal JSON data, equal digest
    (key order and number spelling do not matter). Raise InvalidToolArguments for data JSON
    cannot carry exactly."""
    try:
        canonical = rfc8785.dumps(value)
    except rfc8785.CanonicalizationError as exc:
        # For example an integer beyond ±(2**53 - 1), which JSON numbers cannot carry exactly.
        raise InvalidToolArguments(f"arguments: {exc}") from None
    return hashlib.sha256(canonical).hexdigest()


def fingerprint(tool: ToolSpec, normalized: dict[str, Any]) -> str:
    """The digest of the tool name and its arguments.

    NORMALIZED is the output of ``tool.normalize_arguments``; the key argument is left out,
    so the key's carrier never changes the fingerprint.
    """
    material = {k: v for k, v in normalized.items() if k != tool.key_argument}
    return digest({"tool": tool.name, "arguments": material})


def _normalize(tool: ToolSpec, arguments: object) -> dict[str, Any]:
    if not isinstance(arguments, dict):
        raise InvalidToolArguments("arguments must be a JSON object")
    try:
        return tool.normalize_arguments(arguments)
    except InvalidArguments as exc:
        raise InvalidToolArguments(str(exc)) from None


def _ms(value: timedelta) -> int:
    return int(value.total_seconds() * 1000)


# --- accept ------------------------------------------------------------------------------


def accept(
    *,
    client: Client,
    tool: ToolSpec,
    arguments: dict[str, Any],
    era: str,
    key: IdempotencyKey | None = None,
    journal: list[dict[str, Any]] | None = None,
    client_answers: str | None = None,
    rerun_of: Task | None = None,
    also: Callable[[Task], None] | None = None,
    started_by: StartedBy | None = None,
) -> Receipt:
    """Create CLIENT's task for a call of TOOL, or return the task an earlier call with the
    same idempotency KEY created. CLIENT_ANSWERS is how the calling client can answer the
    task's questions (``Task.client_answers``; None: not known). A run again
    (``tasks_app.rerun``) gives the task it runs again (RERUN_OF) and ALSO, which writes its
    copied effects and links in the acceptance's transaction. STARTED_BY, for a call made
    with an OAuth token, is recorded in that transaction too.

    The task row, its ``accepted`` event and its dispatch record (plus JOURNAL, the answers
    collected in synchronous rounds before escalation) are committed before this returns.
    Call it outside any transaction. Raise an AcceptanceError subclass (-32602) for a missing
    required key, invalid arguments, or a key reused with a different call; nothing is
    written then.
    """
    origin = _origin(started_by) if started_by is not None else None
    with tracing.span("accept", tool=tool.name):
        return _accept(
            client, tool, arguments, era, key, journal, client_answers, rerun_of, also, origin
        )


def _origin(started_by: StartedBy) -> TaskOrigin:
    """The unsaved TaskOrigin row of STARTED_BY, which ``insert_or_get`` writes with the
    task (only OAuth calls pay for it)."""
    return TaskOrigin(
        app=started_by.app[:200],
        person_id=started_by.person_id,
        person_name=started_by.person_name[:150],
        grant_id=started_by.grant_id,
    )


def key_required(tool: ToolSpec) -> str:
    """Why a keyless call of TOOL is refused (the MCP layer adds how to send a key)."""
    return (
        f"Tool {tool.name!r} requires an idempotency key, so that a retried call cannot run twice."
    )


def _accept(
    client: Client,
    tool: ToolSpec,
    arguments: dict[str, Any],
    era: str,
    key: IdempotencyKey | None,
    journal: list[dict[str, Any]] | None,
    client_answers: str | None,
    rerun_of: Task | None = None,
    also: Callable[[Task], None] | None = None,
    origin: TaskOrigin | None = None,
) -> Receipt:
    if key is None and tool.requires_idempotency_key:
        raise IdempotencyKeyRequired(key_required(tool), {"reason": "idempotency_key_required"})
    normalized = _normalize(tool, arguments)
    size = storage.json_bytes(normalized)
    if size > settings.TASKDESK_MAX_ARGUMENT_BYTES:
        raise ArgumentsTooLarge(size, settings.TASKDESK_MAX_ARGUMENT_BYTES)
    value, carrier = (key.value, key.carrier) if key else (None, None)
    limit = settings.TASKDESK_MAX_ACTIVE_TASKS_PER_CLIENT
    if limit and _at_active_limit(client, limit) and not _key_used(client, value):
        raise ActiveTaskLimit(limit)
    full = storage.over_quota(client.pk)
    if full is not None and not _key_used(client, value):
        raise StorageQuota(*full)
    fp = fingerprint(tool, normalized)
    task = new_task(client, tool, normalized, fp, value, era, client_answers=client_answers)
    task.stored_bytes = size
    task.rerun_of = rerun_of
    # The dispatch record written here keeps this span's context for the task's first leg.
    with tracing.span("dispatch", tool=tool.name):
        stored = db.backend().insert_or_get(
            task, actor=client.name, carrier=carrier, journal=journal or [],
            also=also, origin=origin,
        )  # fmt: skip
    if isinstance(stored, db.Accepted):
        dispatch.publish_on_commit(stored.dispatch_id, stored.task.pk, unless_drained=True)
        storage.accepted(client.pk, size)
        metrics.task_accepted(tool=tool.name, replayed=False)
        return Receipt(task=stored.task, replayed=False, key=value, carrier=carrier)
    if stored.task.fingerprint != task.fingerprint:
        raise _reused(value)
    metrics.task_accepted(tool=tool.name, replayed=True)
    return Receipt(task=stored.task, replayed=True, key=value, carrier=carrier)


class _ActiveCounts:
    """What this process last counted of each client's active tasks, and how many calls it
    may still accept for the client without counting again.

    After a count of C active tasks against a limit L, the process skips the count for the
    next (L - C) // SHARE calls of that client, within TRUST_SECONDS. SHARE is the number of
    web processes this allowance is safe for: together they accept at most L - C tasks on a
    stale count, so the limit holds as it does without the allowance. Near the limit the
    allowance is 0: every call counts.
    """

    SHARE = 8
    TRUST_SECONDS = 1.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._allowance: dict[tuple[int, int], tuple[float, int]] = {}

    def spend(self, client_id: int, limit: int) -> bool:
        """Take one call from the allowance; False when the caller must count."""
        key = (client_id, limit)
        with self._lock:
            since, left = self._allowance.get(key, (0.0, 0))
            if left <= 0 or time.monotonic() - since > self.TRUST_SECONDS:
                return False
            self._allowance[key] = (since, left - 1)
            return True

    def counted(self, client_id: int, limit: int, active: int) -> None:
        with self._lock:
            if len(self._allowance) > 10_000:
                self._allowance.clear()  # clients come and go; never grow without bound
            self._allowance[(client_id, limit)] = (time.monotonic(), (limit - active) // self.SHARE)


_active_counts = _ActiveCounts()


def _at_active_limit(client: Client, limit: int) -> bool:
    if _active_counts.spend(client.pk, limit):
        return False
    # Reads at most LIMIT entries of the partial index task_client_active.
    active = Task.objects.filter(client=client, status__in=ACTIVE_STATUSES)
    count = active.values_list("pk", flat=True)[:limit].count()
    _active_counts.counted(client.pk, limit, count)
    return count >= limit


def _key_used(client: Client, key: str | None) -> bool:
    return key is not None and Task.objects.filter(client=client, idempotency_key=key).exists()


def new_task(
    client: Client,
    tool: ToolSpec,
    normalized: dict[str, Any],
    fp: str,
    key: str | None,
    era: str,
    *,
    client_answers: str | None = None,
) -> Task:
    """The unsaved task row of an accepted call."""
    ttl_ms = _ms(tool.ttl) if tool.ttl is not None else settings.TASKDESK_TASK_TTL_SECONDS * 1000
    poll_ms = (
        _ms(tool.poll_interval)
        if tool.poll_interval is not None
        else settings.TASKDESK_POLL_INTERVAL_MS
    )
    now = timezone.now()
    expiry = retention.expiry_for(ttl_ms)
    return Task(
        client=client,
        tool_name=tool.name,
        arguments=normalized,
        fingerprint=fp,
        idempotency_key=key,
        status=Status.WORKING,
        era=era,
        client_answers=client_answers,
        ttl_ms=ttl_ms,
        poll_interval_ms=poll_ms,
        created_at=now,
        updated_at=now,
        expires_at=now + expiry if expiry is not None else None,
    )


def _reused(key: str | None) -> IdempotencyKeyReused:
    return IdempotencyKeyReused(
        f"Idempotency key {key!r} was already used by this client for a call with a different "
        "tool or different arguments. A retry must repeat the original call exactly; a new "
        "call needs a new key.",
        {"reason": "idempotency_key_reused", "idempotencyKey": key},
    )
