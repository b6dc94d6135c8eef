"""Accepting a ``tools/call`` as a durable task: idempotency keys, fingerprints, receipts.

``accept`` is the one entry point the MCP handlers of every protocol era call. It resolves
the idempotency key from its carriers, validates and normalizes the arguments, fingerprints
them, and commits the task row, its first event and its dispatch record in one transaction
before it returns the receipt. A retry with the same key gets the original task back.

Concurrency is decided by the partial unique constraint on (client, idempotency_key): the
loser of a race never inserts a second row, it reads the winner's. There is no
read-then-insert window. docs/idempotency.md describes the rules for clients.
"""

from __future__ import annotations

import hashlib
import re
import time
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import timedelta
from functools import cache
from typing import Any

import psycopg
import rfc8785
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, IntegrityError, connection, connections, transaction
from django.utils import timezone
from psycopg.types.json import Jsonb

from tasks_app import dispatch, retention, rows
from tasks_app.models import (
    Actor,
    Client,
    Dispatch,
    JournalEntry,
    Status,
    Task,
    TaskEvent,
    event,
)
from tasks_app.selectors import TaskNotFound
from tasks_app.tools import InvalidArguments, ToolSpec

HEADER = "Idempotency-Key"
META_KEY = "dev.taskdesk/idempotencyKey"
REPLAYED_META = "dev.taskdesk/replayed"

# 1 to 255 visible ASCII characters: no space, no control characters, nothing encoded.
_KEY_RE = re.compile(r"[\x21-\x7e]{1,255}")
_KEY_RULE = (
    "an idempotency key is 1 to 255 visible ASCII characters (0x21-0x7E: letters, digits "
    "and punctuation; no spaces, control characters or non-ASCII characters)"
)


# --- errors ------------------------------------------------------------------------------


class AcceptanceError(Exception):
    """A call that cannot be accepted. Always a JSON-RPC -32602 (invalid params)."""

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


class InvalidToolArguments(AcceptanceError, InvalidArguments):
    """The arguments do not fit the tool's input schema (or cannot be fingerprinted)."""


# --- the receipt -------------------------------------------------------------------------


@dataclass(frozen=True)
class Receipt:
    task: Task
    replayed: bool
    key: str | None
    carrier: str | None


def receipt_meta(receipt: Receipt) -> dict[str, Any]:
    """The ``_meta`` entries of a receipt: keyed receipts say whether they are a replay."""
    if receipt.key is None:
        return {}
    return {REPLAYED_META: receipt.replayed}


# --- keys and fingerprints ---------------------------------------------------------------


def _carrier_label(carrier: str, tool: ToolSpec) -> str:
    if carrier == "header":
        return f"the {HEADER} header"
    if carrier == "meta":
        return f'params._meta["{META_KEY}"]'
    return f'the "{tool.key_argument}" argument'


def resolve_key(
    *,
    tool: ToolSpec,
    arguments: dict[str, Any],
    header_key: str | None,
    meta_key: object | None,
) -> tuple[str | None, str | None]:
    """Return (key, carrier) from the three carriers, or (None, None) when none is used.

    Raise InvalidIdempotencyKey for a malformed key and ConflictingKeyCarriers when two
    carriers hold different keys (the same key twice is fine).
    """
    found: list[tuple[str, object]] = []
    if header_key is not None:
        # HTTP strips surrounding whitespace from field values (RFC 9110 §5.5).
        found.append(("header", header_key.strip(" \t")))
    if meta_key is not None:
        found.append(("meta", meta_key))
    if (
        tool.key_argument
        and isinstance(arguments, dict)
        and arguments.get(tool.key_argument) is not None
    ):
        found.append(("argument", arguments[tool.key_argument]))
    for carrier, value in found:
        if not isinstance(value, str) or not _KEY_RE.fullmatch(value):
            what = "is not a string" if not isinstance(value, str) else "is not a valid key"
            raise InvalidIdempotencyKey(
                f"{_carrier_label(carrier, tool)} {what}: {_KEY_RULE}.",
                {"reason": "invalid_idempotency_key", "carrier": carrier},
            )
    if not found:
        return None, None
    key = found[0][1]
    disagreeing = [c for c, v in found if v != key]
    if disagreeing:
        first, second = found[0][0], disagreeing[0]
        raise ConflictingKeyCarriers(
            f"Two different idempotency keys were sent, in {_carrier_label(first, tool)} and "
            f"in {_carrier_label(second, tool)}. Send the key once, or the same value in each.",
            {"reason": "conflicting_idempotency_keys", "carriers": [first, second]},
        )
    assert isinstance(key, str)
    return key, "+".join(c for c, _ in found)


def key_required_message(tool: ToolSpec) -> str:
    ways = f'the {HEADER} HTTP header or params._meta["{META_KEY}"]'
    if tool.key_argument:
        ways = f'the {HEADER} HTTP header, params._meta["{META_KEY}"] or the "{tool.key_argument}" argument'
    return (
        f"Tool {tool.name!r} requires an idempotency key, so that a retried call cannot run "
        f"twice. Send one in {ways}: 1 to 255 visible ASCII characters, new for each call "
        "and the same on every retry of that call."
    )


def fingerprint(tool: ToolSpec, normalized: dict[str, Any]) -> str:
    """SHA-256 (hex) of the RFC 8785 canonical JSON of the tool name and its arguments.

    NORMALIZED is the output of ``tool.normalize_arguments``; the key argument is left out,
    so the key's carrier never changes the fingerprint.
    """
    material = {k: v for k, v in normalized.items() if k != tool.key_argument}
    try:
        canonical = rfc8785.dumps({"tool": tool.name, "arguments": material})
    except rfc8785.CanonicalizationError as exc:
        # For example an integer beyond ±(2**53 - 1), which JSON numbers cannot carry exactly.
        raise InvalidToolArguments(f"arguments: {exc}") from None
    return hashlib.sha256(canonical).hexdigest()


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
    header_key: str | None = None,
    meta_key: object | None = None,
    journal: list[dict[str, Any]] | None = None,
) -> Receipt:
    """Create CLIENT's task for a call of TOOL, or return the task an earlier call with the
    same idempotency key created.

    The task row, its ``accepted`` event and its dispatch record (plus JOURNAL, the answers
    collected in synchronous rounds before escalation) are committed before this returns.
    Call it outside any transaction. Raise an AcceptanceError subclass (-32602) for a bad key,
    two disagreeing key carriers, a missing required key, invalid arguments, or a key reused
    with a different call; nothing is written then.
    """
    key, carrier = resolve_key(
        tool=tool, arguments=arguments, header_key=header_key, meta_key=meta_key
    )
    if key is None and tool.requires_idempotency_key:
        raise IdempotencyKeyRequired(
            key_required_message(tool), {"reason": "idempotency_key_required"}
        )
    normalized = _normalize(tool, arguments)
    task = _new_task(client, tool, normalized, fingerprint(tool, normalized), key, era)
    if connection.vendor == "postgresql" and not journal:
        return _accept_postgresql(task, carrier=carrier, actor=client.name)
    return _accept_orm(task, carrier=carrier, actor=client.name, journal=journal or [])


def _new_task(
    client: Client,
    tool: ToolSpec,
    normalized: dict[str, Any],
    fp: str,
    key: str | None,
    era: str,
) -> Task:
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
        ttl_ms=ttl_ms,
        poll_interval_ms=poll_ms,
        created_at=now,
        updated_at=now,
        expires_at=now + expiry if expiry is not None else None,
    )


def _replay(winner: Task, task: Task, *, carrier: str | None, actor: str) -> Receipt:
    if winner.fingerprint != task.fingerprint:
        raise _reused(task.idempotency_key)
    event(
        winner,
        "duplicate_submission",
        actor_type=Actor.CLIENT,
        actor=actor,
        era=task.era,
        carrier=carrier,
    )
    return Receipt(task=winner, replayed=True, key=task.idempotency_key, carrier=carrier)


def _reused(key: str | None) -> IdempotencyKeyReused:
    return IdempotencyKeyReused(
        f"Idempotency key {key!r} was already used by this client for a call with a different "
        "tool or different arguments. A retry must repeat the original call exactly; a new "
        "call needs a new key.",
        {"reason": "idempotency_key_reused", "idempotencyKey": key},
    )


def _accept_orm(
    task: Task, *, carrier: str | None, actor: str, journal: list[dict[str, Any]]
) -> Receipt:
    # durable=True: the receipt must be committed when accept returns, so refuse to run
    # inside a transaction opened by the caller.
    for _attempt in range(3):
        with transaction.atomic(durable=True):
            try:
                # A savepoint, because on PostgreSQL a failed INSERT aborts the transaction.
                with transaction.atomic():
                    task.save(force_insert=True)
            except IntegrityError:
                if task.idempotency_key is None:
                    raise
                # The winner is committed and visible here: PostgreSQL reports the unique
                # violation only after the other transaction commits, and this statement
                # takes a fresh READ COMMITTED snapshot; on SQLite the IMMEDIATE transaction
                # holds the write lock, so every earlier writer has committed.
                winner = Task.objects.filter(
                    client_id=task.client_id, idempotency_key=task.idempotency_key
                ).first()
                if winner is None:
                    continue  # purged in between: try again
                return _replay(winner, task, carrier=carrier, actor=actor)
            _accepted_event(task, carrier=carrier, actor=actor).save()
            dispatch.enqueue(task, reason="accepted")
            JournalEntry.objects.bulk_create(
                JournalEntry(
                    task=task, seq=e["seq"], kind=e["kind"], name=e["name"], outcome=e["outcome"]
                )
                for e in journal
            )
        return Receipt(task=task, replayed=False, key=task.idempotency_key, carrier=carrier)
    raise RuntimeError(f"could not accept or find task with key {task.idempotency_key!r}")


def _accepted_event(task: Task, *, carrier: str | None, actor: str) -> TaskEvent:
    return TaskEvent(
        task=task,
        kind="accepted",
        actor_type=Actor.CLIENT,
        actor=actor,
        new_status=task.status,
        detail={"era": task.era, "carrier": carrier},
    )


# --- PostgreSQL: one statement ---------------------------------------------------------
#
# New submissions and replays are the hot path, so on PostgreSQL they take one round trip:
# a single statement with data-modifying CTEs, atomic by itself. It inserts the task unless
# the (client, key) constraint already holds one (ON CONFLICT DO NOTHING), and in the same
# statement writes either the "accepted" event and the dispatch record for the new row, or
# the "duplicate_submission" event for the existing row when the fingerprints match.
#
# Every part sees the snapshot taken when the statement started. A row inserted by a
# concurrent transaction that commits after that is skipped by ON CONFLICT (which waits for
# it) but is invisible to old_task, so the statement returns nothing; it is then simply run
# again, with a fresh READ COMMITTED snapshot in which the winner is visible.
#
# The statement is prepared on the server (planning it costs more than running it), which
# needs server-side parameter binding; Django's cursors bind on the client.

_INSERT_OR_GET = """
WITH new_task AS (
    INSERT INTO {task} ({columns}) VALUES ({values})
    ON CONFLICT (client_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING {columns}
), old_task AS (
    SELECT {columns} FROM {task}
    WHERE client_id = %(client_id)s AND idempotency_key = %(idempotency_key)s
), accepted_event AS (
    INSERT INTO {event} (task_id, kind, actor_type, actor, old_status, new_status, detail, created_at)
    SELECT id, 'accepted', %(actor_type)s, %(actor)s, '', status, %(detail)s, %(created_at)s
    FROM new_task
), duplicate_event AS (
    INSERT INTO {event} (task_id, kind, actor_type, actor, old_status, new_status, detail, created_at)
    SELECT id, 'duplicate_submission', %(actor_type)s, %(actor)s, '', '', %(detail)s, %(now)s
    FROM old_task WHERE fingerprint = %(fingerprint)s
), outbox AS (
    INSERT INTO {dispatch} (task_id, reason, created_at, attempts)
    SELECT id, 'accepted', %(created_at)s, 0 FROM new_task
    RETURNING id
)
SELECT new_task.*, outbox.id FROM new_task, outbox
UNION ALL
SELECT old_task.*, NULL FROM old_task
"""


def _accept_postgresql(task: Task, *, carrier: str | None, actor: str) -> Receipt:
    db = connections[DEFAULT_DB_ALIAS]  # the wrapper itself: the proxy costs a lookup per use
    columns = rows.task_columns()
    params = {c.name: c.value(task, db) for c in columns}
    params.update(
        actor_type=Actor.CLIENT.value,
        actor=actor,
        detail=Jsonb({"era": task.era, "carrier": carrier}),
        now=timezone.now(),
    )
    # Outside a transaction the statement commits by itself. Inside one, the receipt would
    # not be durable on return: a durable atomic block refuses that (except in a test case).
    guard = transaction.atomic(durable=True) if db.in_atomic_block else nullcontext()
    for _attempt in range(3):
        with guard, db.wrap_database_errors:
            db.ensure_connection()
            with psycopg.Cursor(db.connection) as cursor:
                cursor.execute(_insert_or_get_sql(), params, prepare=True)
                row = cursor.fetchone()
        if row is None:
            continue  # lost a race to a transaction that committed meanwhile: look again
        found = rows.task_from_row(db, columns, row[:-1])
        dispatch_id = row[-1]
        if dispatch_id is not None:
            dispatch.publish_on_commit(dispatch_id, found.pk)
            return Receipt(task=found, replayed=False, key=found.idempotency_key, carrier=carrier)
        if found.fingerprint != task.fingerprint:
            raise _reused(task.idempotency_key)
        return Receipt(task=found, replayed=True, key=found.idempotency_key, carrier=carrier)
    raise RuntimeError(f"could not accept or find task with key {task.idempotency_key!r}")


@cache
def _insert_or_get_sql() -> str:
    q = connection.ops.quote_name
    names = [column.name for column in rows.task_columns()]
    return _INSERT_OR_GET.format(
        task=q(Task._meta.db_table),
        event=q(TaskEvent._meta.db_table),
        dispatch=q(Dispatch._meta.db_table),
        columns=", ".join(q(name) for name in names),
        values=", ".join(f"%({name})s" for name in names),
    )


# --- waiting for the outcome -----------------------------------------------------------


def wait_for_outcome(task_id: str, timeout: float) -> Task:
    """Return task TASK_ID once it is terminal, or as it is when TIMEOUT seconds ran out.

    Polls the database (each read sees the latest commit), quickly at first and then every
    quarter second. Raise TaskNotFound if the task no longer exists. Call it outside any
    transaction.
    """
    deadline = time.monotonic() + timeout
    delay = 0.02
    while True:
        task = Task.objects.filter(pk=task_id).first()
        if task is None:
            raise TaskNotFound(task_id)
        left = deadline - time.monotonic()
        if task.is_terminal or left <= 0:
            return task
        time.sleep(min(delay, left))
        delay = min(delay * 1.5, 0.25)
