"""The hot-path statements: accepting a call, claiming and renewing a lease, ending a leg,
and the prepared task read, in one module.

Every ``tools/call``, every leg and every ``tasks/get`` runs these, so they are written as
SQL once per process instead of being built by the ORM on each call (building the query
cost more CPU than running it). ``hot_path()`` chooses, once, between two implementations
of the same operations; no other module asks which database it runs on:

- ``PostgreSQL``: each operation is a single statement (data-modifying CTEs), atomic by
  itself and so run outside any transaction block, in one round trip, and prepared on the
  server (see ``fetch_prepared``). These statements use what only PostgreSQL has: ``ON
  CONFLICT ... DO NOTHING`` with a partial unique index, ``FOR UPDATE SKIP LOCKED``, data-
  modifying CTEs and ``jsonb``.
- ``Portable`` (SQLite, the embedded default): the same operations as short sequences of
  statements inside a transaction (SQLite's IMMEDIATE transactions serialize writers).

Who writes what here:

- ``Task.status``: only ``end_leased`` changes it, and only ``tasks_app.transitions`` calls
  that (``insert_or_get`` inserts new rows as ``working``).
- The lease columns (``lease_owner``, ``lease_expires_at``, ``leg``): this module is their
  only writer (``claim``, ``claim_next``, ``renew``, ``release``, ``expire_lease`` and the
  end of a leg, which clears the lease in the statement that ends the task).

Leases are fenced and kept on the database's clock. A claim sets ``lease_expires_at`` to the
database's time plus the lease length and bumps ``leg``, the lease generation: the leg's
fencing token. Every comparison with a lease expiry (claimable, renewal, expiry, a leg's
writes) is made against the database's clock in SQL (``statement_timestamp()`` on
PostgreSQL, SQLite's own ``strftime('now')``), never a worker's, so a worker whose clock is
wrong cannot take or keep a lease it should not. ``holds`` is the fence every write of a leg
checks in its statement or transaction: the lease is still (owner, generation) and not
expired by the database's clock.
- ``TaskEvent`` rows written inside these statements go through ``_EVENT_INSERT``, built once.
- Pending questions are closed through ``tasks_app.seams`` (the elicitations app owns them).
"""

from __future__ import annotations

import json
import math
import re
import time
import weakref
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache, cached_property, lru_cache
from typing import Any

import psycopg
from django.db import DEFAULT_DB_ALIAS, IntegrityError, connections, models, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import F, Field, Q
from django.db.models.expressions import Col
from django.db.models.functions import Now
from django.utils.dateparse import parse_datetime
from psycopg.types.datetime import TimestamptzLoader
from psycopg.types.json import Jsonb

from tasks_app import outbox, seams, tracing
from tasks_app.models import (
    Actor,
    Channel,
    Client,
    Dispatch,
    Drainer,
    Effect,
    EffectState,
    EventKind,
    JournalEntry,
    OutboxMessage,
    Status,
    Task,
    TaskEvent,
    Tenant,
    WebhookEndpoint,
    event,
)

# --- task rows ------------------------------------------------------------------------------

# Field types whose Python values psycopg takes as they are (Django's preparation of them is
# the identity on PostgreSQL); any other type goes through get_db_prep_save.
_AS_IS = (
    models.CharField,
    models.TextField,
    models.IntegerField,
    models.BooleanField,
    models.DateTimeField,
    models.ForeignKey,
)


@dataclass(frozen=True)
class Column:
    """One column of the task row, with what writing and reading it needs."""

    name: str
    field: Field[Any, Any]
    col: Col
    as_is: bool
    converters: tuple[Any, ...]

    def value(self, task: Task, db: BaseDatabaseWrapper) -> Any:
        value = getattr(task, self.field.attname)
        if value is None and getattr(self.field, "auto_now_add", False):
            value = self.field.pre_save(task, True)
        return value if self.as_is else self.field.get_db_prep_save(value, connection=db)


@cache
def task_columns() -> tuple[Column, ...]:
    db = connections[DEFAULT_DB_ALIAS]
    columns = []
    for field in Task._meta.concrete_fields:
        col = field.get_col(Task._meta.db_table)
        assert field.column is not None  # a concrete field has a column
        columns.append(
            Column(
                name=field.column,
                field=field,
                col=col,
                as_is=isinstance(field, _AS_IS),
                converters=tuple(db.ops.get_db_converters(col) + col.get_db_converters(db)),
            )
        )
    return tuple(columns)


def task_from_row(
    db: BaseDatabaseWrapper, columns: tuple[Column, ...], values: tuple[Any, ...]
) -> Task:
    # What Django's SQL compiler does with a fetched row: run each column's converters.
    converted = list(values)
    for i, column in enumerate(columns):
        for converter in column.converters:
            converted[i] = converter(converted[i], column.col, db)
    return Task.from_db(db.alias, [column.field.attname for column in columns], converted)


def fetch_prepared(sql: str, params: dict[str, Any]) -> tuple[Any, ...] | None:
    """PostgreSQL only: run SQL as a prepared statement (parsed and planned once per
    connection, which matters for the big statements of the hot paths) and return its first
    row. Errors become Django's database errors.

    Django's cursors bind parameters on the client, and its psycopg backend disables
    psycopg's own preparation; this runs a psycopg cursor on Django's connection instead.
    """
    db = connections[DEFAULT_DB_ALIAS]
    with db.wrap_database_errors:
        db.close_if_health_check_failed()  # as Django's own cursors do first
        db.ensure_connection()
        _replan_if_due(db.connection)
        text, names = native_statement(sql)
        cursor = _kept_cursor(db)
        cursor.execute(text, [params[name] for name in names], prepare=True)
        row: tuple[Any, ...] | None = cursor.fetchone()
    return row


def _kept_cursor(db: BaseDatabaseWrapper) -> psycopg.RawCursor[Any]:
    """The RawCursor ``fetch_prepared`` keeps for the life of DB's current connection.

    A cursor adapts with dumpers and loaders it makes on first use and keeps: a new cursor for
    every statement made them again each time (a JSON dumper per jsonb parameter, a timestamp
    loader per column), about 12 us of a ``tasks/get``'s CPU. The cursor is the connection's
    thread's, as Django's connection is; a new connection gets a new cursor.

    Its timestamps are read by psycopg's own loader, in C, instead of the Python subclass
    Django registers on the connection to give them its time zone: Django's connections run
    in UTC (``USE_TZ``), so both give the same moment in UTC, and a task row holds five.
    """
    kept: psycopg.RawCursor[Any] | None = getattr(db, "_kept_cursor", None)
    if kept is None or kept.connection is not db.connection or kept.closed:
        kept = psycopg.RawCursor(db.connection)
        kept.adapters.register_loader("timestamptz", TimestamptzLoader)
        db._kept_cursor = kept  # type: ignore[attr-defined]
    return kept


_NAMED = re.compile(r"%\((\w+)\)s|%%|%")


@lru_cache(maxsize=256)
def native_statement(sql: str) -> tuple[bytes, tuple[str, ...]]:
    """SQL's ``%(name)s`` placeholders as PostgreSQL's own (``$1``, ``$2``...), with the names
    in that order: converted once per process, where psycopg's cursors would convert them on
    every execution.

    psycopg caches its conversion only for a statement under 4 KiB and 50 parameters; a leg's
    end with the next look is over, and converting it cost a fifth of a drained leg's CPU. Its
    ``RawCursor`` takes the native placeholders as they are.
    """
    names: list[str] = []

    def native(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            if match.group(0) == "%":
                raise ValueError(f"a lone % in a statement: {sql[:80]!r}")
            return "%"
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"

    return _NAMED.sub(native, sql).encode(), tuple(names)


# A prepared statement's plan is chosen for the tables as they are then, and kept: one chosen
# when the task table was nearly empty (a fresh deployment) read it whole on every execution
# once it held thousands of rows (0.9 ms of PostgreSQL per tasks/get, where 0.1 ms does).
# PostgreSQL plans again after ANALYZE, which autovacuum runs only now and then (and never
# when it is off). So each connection drops its cached plans every PLAN_MAX_AGE_SECONDS
# (DISCARD PLANS keeps the statements prepared; the next executions are planned afresh).
PLAN_MAX_AGE_SECONDS = 10.0
_planned_at: weakref.WeakKeyDictionary[psycopg.Connection[Any], float] = weakref.WeakKeyDictionary()


def _replan_if_due(raw: psycopg.Connection[Any]) -> None:
    now = time.monotonic()
    since = _planned_at.get(raw)
    if since is None:
        _planned_at[raw] = now
    elif now - since >= PLAN_MAX_AGE_SECONDS:
        raw.execute("DISCARD PLANS")
        _planned_at[raw] = now


def holds(*, task_id: str, owner: str, leg: int) -> Q:
    """The fence: the task's lease is still OWNER's, of generation LEG, and not expired by
    the database's clock. A leg's writes filter (or lock) the task row with it, in the same
    statement or transaction as the write."""
    return Q(pk=task_id, lease_owner=owner, leg=leg, lease_expires_at__gt=Now())


def tenant_of(task: Task) -> int | None:
    """The tenant of TASK, for its dispatch records: from its loaded client, else one query."""
    client = task._state.fields_cache.get("client")
    if isinstance(client, Client):
        return client.tenant_id
    tenant: int | None = (
        Task.objects.filter(pk=task.pk).values_list("client__tenant_id", flat=True).first()
    )
    return tenant


def _as_datetime(value: Any) -> datetime | None:
    """A lease expiry as a driver returns it (SQLite: naive, or text, in UTC) as an aware
    datetime."""
    if value is None:
        return None
    parsed = value if isinstance(value, datetime) else parse_datetime(str(value))
    assert parsed is not None, value
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


# --- what the operations return -------------------------------------------------------------


@dataclass(frozen=True)
class Accepted:
    """``insert_or_get``: the new task was inserted with its event and dispatch record."""

    task: Task
    dispatch_id: int


@dataclass(frozen=True)
class Existing:
    """``insert_or_get``: the client's key already named this task. A ``duplicate_submission``
    event was written if its fingerprint matches; nothing was written otherwise."""

    task: Task


@dataclass(frozen=True)
class Claim:
    """A leg's claim: its task as the claiming statement read it (the columns a leg needs,
    the new lease), and whether the task has a journal to replay."""

    task: Task
    has_journal: bool
    # The dispatch record's ``context`` (empty for a claim without a record).
    origin: dict[str, Any]
    # Whether cancellation had been requested when the claim read the row: a leg's first
    # checkpoint trusts a "no" for as long as it trusts its own polls.
    cancel_requested: bool = True


@dataclass(frozen=True)
class Next:
    """What ``claim_next`` took: a dispatch record (consumed), the claim of its task (None
    when the task was not claimable), when the record was written, and the oldest waiting
    record it chose from (no older one was waiting, but for one committed late)."""

    dispatch_id: int
    claim: Claim | None
    created_at: datetime | None
    oldest: int | None = None


@dataclass(frozen=True)
class Looked:
    """What a look for the next record found (``claim_next``): ``taken`` or nothing, and the
    ids that bound where the next look may start (PostgreSQL only: ``oldest``, the oldest
    record waiting from the floor up; ``newest``, when nothing was, the newest record id)."""

    taken: Next | None
    oldest: int | None = None
    newest: int | None = None
    # The look found nothing and marked its drainer standing by (``claim_next``'s STANDBY).
    standing_by: bool = False


@dataclass
class LookAfterEnd:
    """A look for the next waiting record (``claim_next``'s, for DRAINER) that the statement
    ending task TASK_ID's leg makes as well (PostgreSQL): a draining worker then spends one
    statement and one round trip per leg instead of two. Set as ``look_after_end`` while the
    leg runs; ``looked`` is what the look found once it was made (None: no end statement of
    that leg ran outside a transaction before DEADLINE, a ``time.monotonic`` time, and the
    caller looks with a statement of its own)."""

    task_id: str
    owner: str  # the next leg's lease owner
    drainer: str
    window: float
    lease_seconds: float
    floor: int
    deadline: float
    # CHANNEL set: if the look finds nothing, it marks DRAINER standing by on CHANNEL until
    # DEADLINE, when at least MIN_STANDBY seconds are left (``claim_next``'s STANDBY).
    channel: str = ""
    min_standby: float = 0.0
    looked: Looked | None = None
    sent: float = 0.0  # monotonic time the look was sent

    def standby_seconds(self) -> float:
        left = self.deadline - time.monotonic()
        return left if self.channel and left >= self.min_standby else 0.0


look_after_end: ContextVar[LookAfterEnd | None] = ContextVar("look_after_end", default=None)


@dataclass(frozen=True)
class Ending:
    """The end of a leased task: its terminal STATUS, the event KIND and what to write."""

    task_id: str
    status: Status
    kind: EventKind
    owner: str
    leg: int
    actor: str
    fields: dict[str, Any]
    detail: dict[str, Any]
    now: datetime
    # The bytes the end adds to the task's ``stored_bytes`` (``tasks_app.storage``).
    grow: int = 0


@dataclass(frozen=True)
class Ended:
    """``end_leased``: what the ended task's duration metric needs."""

    tool_name: str
    created_at: datetime


# --- the portable implementation ----------------------------------------------------------


class Portable:
    """The hot-path operations for any database Django supports (SQLite in practice)."""

    @property
    def db(self) -> BaseDatabaseWrapper:
        # Per thread (Django's connections are thread-local): never cached on the instance.
        return connections[DEFAULT_DB_ALIAS]

    def q(self, name: str) -> str:
        return self.db.ops.quote_name(name)

    @cached_property
    def _tables(self) -> dict[str, str]:
        return {
            "task": self.q(Task._meta.db_table),
            "event": self.q(TaskEvent._meta.db_table),
            "dispatch": self.q(Dispatch._meta.db_table),
            "journal": self.q(JournalEntry._meta.db_table),
            "effect": self.q(Effect._meta.db_table),
            "client": self.q(Client._meta.db_table),
            "tenant": self.q(Tenant._meta.db_table),
            "drainer": self.q(Drainer._meta.db_table),
            "outbox": self.q(OutboxMessage._meta.db_table),
            "endpoint": self.q(WebhookEndpoint._meta.db_table),
        }

    # The database's clock in SQL (with Django's placeholders: ``%%`` is a percent sign),
    # and that clock plus a number of seconds given as the parameter ``_later_param`` makes.
    @property
    def _db_now(self) -> str:
        if self.db.vendor == "sqlite":
            return "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"
        return "CURRENT_TIMESTAMP"

    @property
    def _db_later(self) -> str:
        if self.db.vendor == "sqlite":
            return "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s)"
        return "(CURRENT_TIMESTAMP + %s * INTERVAL '1 second')"

    def _later_param(self, seconds: float) -> Any:
        return f"{seconds:+f} seconds" if self.db.vendor == "sqlite" else seconds

    # Working and not leased by a live leg (by the database's clock); or cancelled while
    # nothing ran, with effects to undo (such a leg replays the journal to find their
    # compensate hooks, then undoes them).
    @cached_property
    def _claimable(self) -> str:
        t = self._tables
        return (
            "(lease_owner = '' OR lease_expires_at < {now}) AND (status = {working} OR "
            f"(status = '{Status.CANCELLED.value}' AND EXISTS (SELECT 1 FROM {t['effect']} e "
            f"WHERE e.task_id = {t['task']}.id AND e.state = '{EffectState.CONFIRMED.value}' "
            "AND e.compensable)))"
        )

    @cached_property
    def _claim_returning(self) -> str:
        t = self._tables
        return (
            "tool_name, arguments, leg, client_id, "
            f"EXISTS (SELECT 1 FROM {t['journal']} j WHERE j.task_id = {t['task']}.id) "
            # The column itself, not "IS NOT NULL": SQLite 3.40 evaluates a null test in an
            # UPDATE's RETURNING wrongly here (true for a NULL).
            "AS has_journal, status, lease_expires_at, cancel_requested_at"
        )

    @cached_property
    def _select_for_client(self) -> str:
        names = ", ".join(self.q(column.name) for column in task_columns())
        return (
            f"SELECT {names} FROM {self._tables['task']} "
            f"WHERE {self.q('id')} = %s AND {self.q('client_id')} = %s"
        )

    # --- reads ------------------------------------------------------------------------------

    def task_for_client(self, client_id: int, task_id: str) -> Task | None:
        """Client CLIENT_ID's task TASK_ID, or None."""
        with self.db.cursor() as cursor:
            cursor.execute(self._select_for_client, [task_id, client_id])
            row = cursor.fetchone()
        return None if row is None else task_from_row(self.db, task_columns(), row)

    # --- acceptance -------------------------------------------------------------------------

    def insert_or_get(
        self, task: Task, *, actor: str, carrier: str | None, journal: list[dict[str, Any]]
    ) -> Accepted | Existing:
        """Insert TASK with its ``accepted`` event, its dispatch record and JOURNAL, unless the
        client's idempotency key already names a task; then return that one. Commits before
        it returns (``durable``: never inside a caller's transaction)."""
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
                    # takes a fresh READ COMMITTED snapshot; on SQLite the IMMEDIATE
                    # transaction holds the write lock, so every earlier writer has committed.
                    winner = Task.objects.filter(
                        client_id=task.client_id, idempotency_key=task.idempotency_key
                    ).first()
                    if winner is None:
                        continue  # purged in between: try again
                    if winner.fingerprint == task.fingerprint:
                        event(winner, EventKind.DUPLICATE_SUBMISSION, actor_type=Actor.CLIENT,
                              actor=actor, era=task.era, carrier=carrier)  # fmt: skip
                    return Existing(winner)
                event(task, EventKind.ACCEPTED, actor_type=Actor.CLIENT, actor=actor,
                      new_status=task.status, era=task.era, carrier=carrier)  # fmt: skip
                # Published by the caller once this commits (``dispatch.publish_on_commit``).
                record = Dispatch.objects.create(
                    task=task,
                    reason="accepted",
                    tenant_id=tenant_of(task),
                    context=tracing.origin(),
                )
                JournalEntry.objects.bulk_create(
                    JournalEntry(task=task, **{k: e[k] for k in ("seq", "kind", "name", "outcome")})
                    for e in journal
                )
            return Accepted(task, record.pk)
        raise RuntimeError(f"could not accept or find task with key {task.idempotency_key!r}")

    # --- leases -----------------------------------------------------------------------------

    def claim(
        self, *, task_id: str, dispatch_id: int | None, owner: str, now: datetime,
        lease_seconds: float,
    ) -> Claim | None:  # fmt: skip
        """Consume dispatch record DISPATCH_ID (a second delivery finds it consumed and gets
        None) and take TASK_ID's lease for a new leg, until the database's time plus
        LEASE_SECONDS, writing ``leg_started``. None when the record was consumed already or
        the task is not claimable. NOW (the worker's time) only stamps the rows."""
        with transaction.atomic(), self.db.cursor() as cursor:
            return self._claim(cursor, task_id, dispatch_id, owner, now, lease_seconds)

    # Fair claiming across tenants. The candidates are the oldest waiting record of each
    # tenant (one index lookup each: dispatch_waiting_tenant) and the oldest of none (records
    # written before records had tenants); the next is the candidate whose tenant has the
    # fewest legs running now, the oldest first among equals. So a tenant's backlog never
    # starves another tenant: a tenant with nothing running goes first. Legs are counted only
    # when there is a choice to make: counting reads the index entries of every lease taken
    # lately (dead row versions included), which cost more than the rest of the claim.
    def _fair_next(self, *, lock: str = "", floor: str = "") -> str:
        t = self._tables
        head = (
            "(SELECT d2.id FROM {dispatch} d2 WHERE {match} AND d2.consumed_at IS NULL"
            f"{floor} ORDER BY d2.id LIMIT 1{{lock}})"
        )
        per_tenant = head.format(dispatch=t["dispatch"], match="d2.tenant_id = tn.id", lock=lock)
        untenanted = head.format(dispatch=t["dispatch"], match="d2.tenant_id IS NULL", lock=lock)
        # Legs of the candidate's tenant running now: tasks holding a live lease (task_leased
        # holds only leased rows).
        running = (
            f"SELECT count(*) FROM {t['task']} rt JOIN {t['client']} c ON c.id = rt.client_id "
            f"WHERE c.tenant_id = candidates.tenant_id AND rt.lease_expires_at > {self._db_now}"
        )
        record = self._head_record.format(dispatch=t["dispatch"])
        return f"""
            WITH candidates AS MATERIALIZED (
                SELECT d.id, d.task_id, d.created_at, d.tenant_id
                FROM (SELECT {per_tenant} AS id FROM {t["tenant"]} tn
                      UNION ALL SELECT {untenanted}) heads
                {record}
            )
            SELECT id, task_id, created_at, (SELECT min(id) FROM candidates) AS oldest
            FROM candidates
            ORDER BY CASE WHEN (SELECT count(*) FROM candidates) > 1 THEN ({running}) ELSE 0 END,
                id
            LIMIT 1"""

    # --- a tenant's share of the running legs ------------------------------------------------

    def over_share(self, *, task_id: str, tenant_id: int, share: float) -> bool:
        """Whether the leg of TASK_ID (of tenant TENANT_ID) should give its worker back: its
        tenant holds more than SHARE of the running legs (and more than one), this is the
        one leg of that tenant chosen to go (the greatest task id, so that legs go one at a
        time), and another tenant that holds at least two legs fewer has a record waiting.

        The fair claim (``_fair_next``) then gives the freed worker to the waiting tenant
        with the fewest legs. The "two fewer" keeps two tenants from trading a leg back and
        forth. The first statement reads only leased tasks (the task_leased index); the
        second, only when this leg is one too many, probes each other tenant's oldest waiting
        record (dispatch_waiting_tenant), as the claim does.
        """
        t = self._tables
        with self.db.cursor() as cursor:
            cursor.execute(
                f"SELECT c.tenant_id, count(*), max(rt.id) FROM {t['task']} rt "
                f"JOIN {t['client']} c ON c.id = rt.client_id "
                f"WHERE rt.lease_expires_at > {self._db_now} GROUP BY c.tenant_id",
                [],
            )
            running = {tenant: (legs, newest) for tenant, legs, newest in cursor.fetchall()}
            legs, newest = running.get(tenant_id, (0, None))
            total = sum(n for n, _ in running.values())
            if newest != task_id or legs <= max(1, math.floor(share * total)):
                return False
            busy = [tenant for tenant, (n, _) in running.items() if tenant is not None]
            busy = [tenant for tenant in busy if running[tenant][0] >= legs - 1]
            marks = ", ".join(["%s"] * len(busy))
            cursor.execute(
                f"SELECT 1 FROM {t['tenant']} tn WHERE tn.id NOT IN ({marks}) AND EXISTS ("
                f"SELECT 1 FROM {t['dispatch']} d WHERE d.tenant_id = tn.id "
                "AND d.consumed_at IS NULL) LIMIT 1",
                busy,
            )
            return cursor.fetchone() is not None

    # How _fair_next reads the record of each head: by its primary key.
    _head_record = "JOIN {dispatch} d ON d.id = heads.id"

    def claim_next(
        self,
        *,
        owner: str,
        now: datetime,
        lease_seconds: float,
        drainer: str | None = None,
        window: float = 0.0,
        floor: int = 0,
        standby: float = 0.0,
        channel: str = "",
    ) -> Looked:
        """Consume the next dispatch record no leg consumed (fair across tenants:
        ``_fair_next``) and claim its task as ``claim`` does; ``taken`` is None when there is
        no such record. With DRAINER, first write that process's ``Drainer`` row: it looks for the
        next record within WINDOW seconds of the database's time (whether or not one was
        found here). FLOOR: look only at records from that id up (a hint PostgreSQL uses,
        ``leases.claim_next``). STANDBY > 0 (where ``can_stand_by``): when nothing is waiting,
        the row says instead that the process stands by for STANDBY seconds on CHANNEL, which
        it LISTENs on already (``stand_by``, made in the same statement)."""
        with transaction.atomic():
            with self.db.cursor() as cursor:
                if drainer is not None:
                    cursor.execute(self._drainer_upsert, [drainer, self._later_param(window)])
                cursor.execute(self._fair_next(), [])  # [] : the placeholders' escapes apply
                record = cursor.fetchone()
            if record is None:
                return Looked(None)
            dispatch_id, task_id, created_at, oldest = record
            with self.db.cursor() as cursor:
                claim = self._claim(cursor, task_id, dispatch_id, owner, now, lease_seconds)
            return Looked(Next(dispatch_id, claim, _as_datetime(created_at), oldest), oldest)

    # --- drainers (``models.Drainer``) -------------------------------------------------------

    @cached_property
    def _drainer_upsert(self) -> str:
        return (
            f"INSERT INTO {self._tables['drainer']} (name, until, standby, channel) "
            f"VALUES (%s, {self._db_later}, false, '') "
            "ON CONFLICT (name) DO UPDATE SET until = excluded.until, standby = false"
        )

    # Standing by (waiting for a record handed over) needs LISTEN/NOTIFY: PostgreSQL only.
    can_stand_by = False

    def stand_by(self, drainer: str, *, channel: str, seconds: float) -> None:
        raise NotImplementedError("standing by needs PostgreSQL's LISTEN/NOTIFY")

    def hand_off(self, payload: str) -> tuple[bool, bool]:
        """Hand a new record (PAYLOAD: "dispatch_id task_id") to a drainer standing by, if
        one is; return (handed over, some drainer is fresh). Without standing by, only the
        second."""
        return False, self.drained()

    def withdraw(self, drainer: str) -> None:
        """Delete DRAINER's row: that process takes no more records without a message."""
        with self.db.cursor() as cursor:
            cursor.execute(f"DELETE FROM {self._tables['drainer']} WHERE name = %s", [drainer])

    def drained(self) -> bool:
        """Whether some process's ``Drainer`` row is fresh by the database's clock: it will
        take a record committed now from the table, without a message."""
        with self.db.cursor() as cursor:
            cursor.execute(  # [] : the placeholders' escapes apply
                f"SELECT 1 FROM {self._tables['drainer']} WHERE until > {self._db_now} LIMIT 1",
                [],
            )
            return cursor.fetchone() is not None

    def forget_drainers(self, *, older_than: float) -> int:
        """Delete the rows of drainers stale for OLDER_THAN seconds (killed processes)."""
        with self.db.cursor() as cursor:
            cursor.execute(
                f"DELETE FROM {self._tables['drainer']} WHERE until < {self._db_later}",
                [self._later_param(-older_than)],
            )
            return int(cursor.rowcount)

    def _claim(
        self, cursor: Any, task_id: str, dispatch_id: int | None, owner: str, now: datetime,
        lease_seconds: float,
    ) -> Claim | None:  # fmt: skip
        at = self.db.ops.adapt_datetimefield_value
        t = self._tables
        if dispatch_id is not None:
            cursor.execute(
                f"UPDATE {t['dispatch']} SET consumed_at = %s "
                "WHERE id = %s AND task_id = %s AND consumed_at IS NULL",
                [at(now), dispatch_id, task_id],
            )
            if cursor.rowcount != 1:
                return None
            cursor.execute(f"SELECT context FROM {t['dispatch']} WHERE id = %s", [dispatch_id])
            (origin,) = cursor.fetchone()
        else:
            origin = None
        claimable = self._claimable.format(now=self._db_now, working="%s")
        cursor.execute(
            f"UPDATE {t['task']} SET lease_owner = %s, lease_expires_at = {self._db_later}, "
            f"leg = leg + 1, updated_at = %s WHERE id = %s AND {claimable} "
            f"RETURNING {self._claim_returning}",
            [owner, self._later_param(lease_seconds), at(now), task_id, Status.WORKING.value],
        )
        row = cursor.fetchone()
        if row is None:
            return None
        claim = self._claimed(task_id, owner, (*row, origin))
        event(Task(id=task_id), EventKind.LEG_STARTED, actor_type=Actor.WORKER, actor=owner,
              leg=claim.task.leg, dispatch=dispatch_id)  # fmt: skip
        return claim

    def _claimed(self, task_id: str, owner: str, row: tuple[Any, ...]) -> Claim:
        tool_name, arguments, leg, client_id, has_journal, status, expires, cancel, origin = row
        task = Task(
            id=task_id,  # not pk=: Model.__init__ would first draw a new id as the default
            client_id=client_id,
            tool_name=tool_name,
            arguments=_ARGUMENTS.from_db_value(arguments, _ARGUMENTS_COL, self.db),
            status=status,
            leg=leg,
            lease_owner=owner,
            lease_expires_at=_as_datetime(expires),
        )
        return Claim(
            task=task,
            has_journal=bool(has_journal),
            origin=_origin(origin),
            cancel_requested=cancel is not None,
        )

    def renew(self, *, task_id: str, owner: str, leg: int, lease_seconds: float) -> bool:
        """Push the expiry of OWNER's lease (generation LEG) to the database's time plus
        LEASE_SECONDS. False if the lease is no longer OWNER's, or has already expired by the
        database's clock: a lease is never revived."""
        t = self._tables
        with self.db.cursor() as cursor:
            cursor.execute(
                f"UPDATE {t['task']} SET lease_expires_at = {self._db_later} "
                "WHERE id = %s AND lease_owner = %s AND leg = %s AND status IN (%s, %s) "
                f"AND lease_expires_at > {self._db_now}",
                [self._later_param(lease_seconds), task_id, owner, leg, Status.WORKING.value,
                 Status.CANCELLED.value],
            )  # fmt: skip
            return bool(cursor.rowcount == 1)

    def lock_leased(self, *, task_id: str, owner: str, leg: int) -> Task | None:
        """Lock TASK_ID's row if OWNER still holds its lease of generation LEG (``holds``), in
        the caller's transaction; None if not. The writes a leg makes in the same
        transaction are then fenced: no other leg can claim the task until it commits."""
        return (
            Task.objects.select_for_update()
            .filter(holds(task_id=task_id, owner=owner, leg=leg))
            .first()
        )

    def release(
        self, *, task_id: str, owner: str | None, now: datetime, leg: int | None = None
    ) -> bool:
        """Give up OWNER's lease of generation LEG (any lease when OWNER is None), in the
        caller's transaction. False if OWNER's lease was lost (or there was none)."""
        leased = Task.objects.filter(pk=task_id)
        if owner is None:
            leased = leased.exclude(lease_owner="")
        else:
            leased = leased.filter(lease_owner=owner)
            if leg is not None:
                leased = leased.filter(leg=leg)
        return bool(leased.update(lease_owner="", lease_expires_at=None, updated_at=now))

    def expired_leases(self, *, status: str, limit: int) -> list[tuple[str, str, str, int]]:
        """(id, status, lease owner, leg) of tasks in STATUS whose lease expired by the
        database's clock, the longest expired first."""
        return list(
            Task.objects.filter(status=status, lease_expires_at__lt=Now())
            .order_by("lease_expires_at")
            .values_list("pk", "status", "lease_owner", "leg")[:limit]
        )

    def expire_lease(self, *, task_id: str, status: str, owner: str, now: datetime) -> bool:
        """Take away OWNER's lease of TASK_ID if it expired by the database's clock
        (compare-and-set: a leg that renewed in the meantime keeps it). In the caller's
        transaction."""
        return bool(
            Task.objects.filter(
                pk=task_id, status=status, lease_owner=owner, lease_expires_at__lt=Now()
            ).update(lease_owner="", lease_expires_at=None, updated_at=now)
        )

    # --- the end of a leg -------------------------------------------------------------------

    def end_leased(self, ending: Ending) -> Ended | None:
        """End leased, working task ENDING.task_id in ENDING.status: write its fields, clear
        the lease, write the event and close its pending questions. None, having written
        nothing, if ENDING.owner no longer holds the lease (generation ENDING.leg, unexpired by
        the database's clock) of a working task."""
        e = ending
        with transaction.atomic():
            changed = Task.objects.filter(
                holds(task_id=e.task_id, owner=e.owner, leg=e.leg), status=Status.WORKING
            ).update(status=e.status, updated_at=e.now, finished_at=e.now, lease_owner="",
                     lease_expires_at=None, stored_bytes=F("stored_bytes") + e.grow,
                     **e.fields)  # fmt: skip
            if not changed:
                return None
            task = Task(id=e.task_id)
            event(task, e.kind, actor_type=Actor.WORKER, actor=e.actor,
                  old_status=Status.WORKING, new_status=e.status, **e.detail)  # fmt: skip
            seams.pending_questions().close(task, reason=e.status)
            outbox.write_for_task(e.task_id, e.kind, now=e.now)
            tool_name, created_at = Task.objects.values_list("tool_name", "created_at").get(
                pk=e.task_id
            )
        return Ended(tool_name=tool_name, created_at=created_at)


_ARGUMENTS = Task._meta.get_field("arguments")
assert isinstance(_ARGUMENTS, models.JSONField)
_ARGUMENTS_COL = _ARGUMENTS.get_col(Task._meta.db_table)

# --- PostgreSQL: one statement per operation ---------------------------------------------

_EVENT_COLUMNS = "(task_id, kind, actor_type, actor, old_status, new_status, detail, created_at)"


def _event_insert(table: str, select: str) -> str:
    """The one shape of a ``TaskEvent`` insert inside a statement: SELECT's rows, in the
    column order of ``_EVENT_COLUMNS``."""
    return f"INSERT INTO {table} {_EVENT_COLUMNS}\n{select}"


class PostgreSQL(Portable):
    """The same operations as ``Portable``, each one prepared statement."""

    # The time of the statement, not of its transaction (``now()``), even inside one.
    @property
    def _db_now(self) -> str:
        return "statement_timestamp()"

    @property
    def _db_later(self) -> str:
        return "(statement_timestamp() + %s * INTERVAL '1 second')"

    # A lateral lookup (LIMIT 1 keeps the planner from flattening it into a join), so each
    # head is one primary-key probe. As a plain join the planner, which cannot tell how few
    # heads there are, hashed the whole dispatch table on every claim: a cost that grew with
    # the table (4 ms per claim at 6,000 records under EXPLAIN ANALYZE; 0.45 ms, whatever the size).
    _head_record = (
        "CROSS JOIN LATERAL (SELECT id, task_id, tenant_id, created_at FROM {dispatch} "
        "WHERE id = heads.id LIMIT 1) d"
    )

    # --- acceptance -------------------------------------------------------------------------
    #
    # The statement inserts the task unless the (client, key) constraint already holds one
    # (ON CONFLICT DO NOTHING), and in the same statement writes either the "accepted" event
    # and the dispatch record of the new row, or the "duplicate_submission" event of the
    # existing row when the fingerprints match.
    #
    # Every part sees the snapshot taken when the statement started. A row inserted by a
    # concurrent transaction that commits after that is skipped by ON CONFLICT (which waits
    # for it) but is invisible to old_task, so the statement returns nothing; it is then run
    # again, with a fresh READ COMMITTED snapshot in which the winner is visible.

    @cached_property
    def insert_or_get_sql(self) -> str:
        t = self._tables
        names = [column.name for column in task_columns()]
        columns = ", ".join(self.q(name) for name in names)
        values = ", ".join(f"%({name})s" for name in names)
        accepted = _event_insert(t["event"], f"""
    SELECT id, '{EventKind.ACCEPTED.value}', %(actor_type)s, %(actor)s, '', status,
        %(detail)s, %(created_at)s
    FROM new_task""")  # fmt: skip
        duplicate = _event_insert(t["event"], f"""
    SELECT id, '{EventKind.DUPLICATE_SUBMISSION.value}', %(actor_type)s, %(actor)s, '', '',
        %(detail)s, %(now)s
    FROM old_task WHERE fingerprint = %(fingerprint)s""")  # fmt: skip
        # A new row is the task as given: only its id comes back (NULL for the other columns,
        # whose types the UNION takes from old_task), so nothing is read back and converted.
        inserted = ", ".join("new_task.id" if name == "id" else "NULL" for name in names)
        return f"""
WITH new_task AS (
    INSERT INTO {t["task"]} ({columns}) VALUES ({values})
    ON CONFLICT (client_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, client_id, status
), old_task AS (
    SELECT {columns} FROM {t["task"]}
    WHERE client_id = %(client_id)s AND idempotency_key = %(idempotency_key)s
), accepted_event AS (
    {accepted}
), duplicate_event AS (
    {duplicate}
), outbox AS (
    INSERT INTO {t["dispatch"]} (task_id, reason, created_at, attempts, tenant_id, context)
    SELECT id, 'accepted', %(created_at)s, 0,
        (SELECT tenant_id FROM {t["client"]} WHERE id = new_task.client_id), %(origin)s
    FROM new_task
    RETURNING id
)
SELECT {inserted}, outbox.id FROM new_task, outbox
UNION ALL
SELECT old_task.*, NULL FROM old_task
"""

    def insert_or_get(
        self, task: Task, *, actor: str, carrier: str | None, journal: list[dict[str, Any]]
    ) -> Accepted | Existing:
        if journal:  # rare (escalated synchronous calls): the transaction path
            return super().insert_or_get(task, actor=actor, carrier=carrier, journal=journal)
        db = self.db
        columns = task_columns()
        params = {c.name: c.value(task, db) for c in columns}
        params.update(
            actor_type=Actor.CLIENT.value,
            actor=actor,
            detail=Jsonb({"era": task.era, "carrier": carrier}),
            now=task.created_at,
            origin=Jsonb(tracing.origin()),
        )
        # Outside a transaction the statement commits by itself. Inside one, the receipt
        # would not be durable on return: a durable atomic block refuses that (except in a
        # test case).
        for _attempt in range(3):
            if db.in_atomic_block:
                with transaction.atomic(durable=True):
                    row = fetch_prepared(self.insert_or_get_sql, params)
            else:
                row = fetch_prepared(self.insert_or_get_sql, params)
            if row is None:
                continue  # lost a race to a transaction that committed meanwhile: look again
            if row[-1] is not None:  # inserted as given: the row is TASK, now saved
                task._state.adding = False
                task._state.db = db.alias
                return Accepted(task, row[-1])
            return Existing(task_from_row(db, columns, row[:-1]))
        raise RuntimeError(f"could not accept or find task with key {task.idempotency_key!r}")

    # --- leases -----------------------------------------------------------------------------

    def _claim_cte(self, *, task: str, dispatch: str) -> str:
        """The claiming UPDATE of a statement whose CTE ``consumed`` holds the record."""
        t = self._tables
        claimable = self._claimable.format(working="%(working)s", now="statement_timestamp()")
        return f"""claimed AS (
            UPDATE {t["task"]} SET lease_owner = %(owner)s,
                lease_expires_at = statement_timestamp() + make_interval(secs => %(lease)s),
                leg = leg + 1, updated_at = %(now)s
            WHERE id = {task} AND {claimable}{dispatch}
            RETURNING id, {self._claim_returning}
        )"""

    def _started(self, dispatch: str, source: str) -> str:
        return _event_insert(self._tables["event"], f"""
            SELECT claimed.id, '{EventKind.LEG_STARTED.value}', %(worker)s, %(owner)s, '', '',
                jsonb_build_object('leg', leg, 'dispatch', {dispatch}), %(now)s
            FROM {source}""")  # fmt: skip

    @cached_property
    def _claim_sql(self) -> str:
        t = self._tables
        claimed = self._claim_cte(
            task="%(task)s",
            dispatch="\n              AND (%(dispatch)s::bigint IS NULL OR EXISTS (SELECT 1 FROM consumed))",
        )
        return f"""
        WITH consumed AS (
            UPDATE {t["dispatch"]} SET consumed_at = %(now)s
            WHERE id = %(dispatch)s AND task_id = %(task)s AND consumed_at IS NULL
            RETURNING id, context
        ), {claimed}, started AS (
            {self._started("%(dispatch)s::bigint", "claimed")}
        )
        SELECT tool_name, arguments, leg, client_id, has_journal, status, lease_expires_at,
            cancel_requested_at, (SELECT context FROM consumed)
        FROM claimed
    """

    # The same for the next waiting record, fair across tenants (``_fair_next``); SKIP LOCKED
    # lets two workers doing this at once take different records. The CTEs (with the next
    # leg's lease owner in the parameter OWNER) and the columns, apart: a leg's end makes the
    # same look in its own statement (``end_leased``).
    def _next_ctes(self, owner: str) -> str:
        t = self._tables
        claimed = self._claim_cte(task="(SELECT task_id FROM consumed)", dispatch="")
        started = self._started("consumed.id", "claimed, consumed")
        return f"""next AS (
            {self._fair_next(lock=" FOR UPDATE SKIP LOCKED", floor=" AND d2.id >= %(floor)s")}
        ), drainer AS (
            INSERT INTO {t["drainer"]} (name, until, standby, channel)
            SELECT %(drainer)s::text, statement_timestamp() + make_interval(
                    secs => CASE WHEN marks THEN %(standby)s ELSE %(window)s END),
                marks, %(channel)s
            FROM (SELECT %(standby)s::float8 > 0 AND NOT EXISTS (SELECT 1 FROM next) AS marks) m
            WHERE %(drainer)s::text IS NOT NULL
            ON CONFLICT (name) DO UPDATE SET until = excluded.until, standby = excluded.standby,
                channel = excluded.channel
            RETURNING standby
        ), consumed AS (
            UPDATE {t["dispatch"]} SET consumed_at = %(now)s
            WHERE id = (SELECT id FROM next)
            RETURNING id, task_id, context, created_at
        ), {claimed.replace("%(owner)s", f"%({owner})s")}, started AS (
            {started.replace("%(owner)s", f"%({owner})s")}
        )"""

    @cached_property
    def _next_columns(self) -> str:
        return f"""consumed.id, consumed.task_id, consumed.created_at, (SELECT oldest FROM next),
            CASE WHEN consumed.id IS NULL THEN (SELECT max(id) FROM {self._tables["dispatch"]})
                END,
            (SELECT standby FROM drainer),
            claimed.tool_name, claimed.arguments, claimed.leg, claimed.client_id,
            claimed.has_journal, claimed.status, claimed.lease_expires_at,
            claimed.cancel_requested_at, consumed.context
        FROM (SELECT 1) AS one LEFT JOIN consumed ON true LEFT JOIN claimed ON true"""

    @cached_property
    def _claim_next_sql(self) -> str:
        return f"WITH {self._next_ctes('owner')}\nSELECT {self._next_columns}"

    def _looked(self, owner: str, row: tuple[Any, ...]) -> Looked:
        """What a look found, from its columns (``_next_columns``)."""
        dispatch_id, task_id, created_at, oldest, newest, standing_by, *claimed = row
        if dispatch_id is None:
            return Looked(None, None, newest, standing_by=bool(standing_by))
        claim = None if claimed[0] is None else self._claimed(task_id, owner, tuple(claimed))
        return Looked(Next(dispatch_id, claim, created_at, oldest), oldest)

    def _claim_params(self, owner: str, now: datetime, lease_seconds: float) -> dict[str, Any]:
        return {
            "now": now,
            "lease": float(lease_seconds),
            "owner": owner,
            "working": Status.WORKING.value,
            "worker": Actor.WORKER.value,
        }

    def claim(
        self, *, task_id: str, dispatch_id: int | None, owner: str, now: datetime,
        lease_seconds: float,
    ) -> Claim | None:  # fmt: skip
        params = self._claim_params(owner, now, lease_seconds)
        row = fetch_prepared(self._claim_sql, {**params, "task": task_id, "dispatch": dispatch_id})
        return None if row is None else self._claimed(task_id, owner, row)

    def claim_next(
        self,
        *,
        owner: str,
        now: datetime,
        lease_seconds: float,
        drainer: str | None = None,
        window: float = 0.0,
        floor: int = 0,
        standby: float = 0.0,
        channel: str = "",
    ) -> Looked:
        params = self._claim_params(owner, now, lease_seconds)
        params.update(
            drainer=drainer,
            window=float(window),
            floor=floor,
            standby=float(standby),
            channel=channel,
        )
        row = fetch_prepared(self._claim_next_sql, params)
        assert row is not None  # always one row
        return self._looked(owner, row)

    @cached_property
    def _drained_sql(self) -> str:
        return (
            f"SELECT EXISTS (SELECT 1 FROM {self._tables['drainer']} "
            "WHERE until > statement_timestamp())"
        )

    def drained(self) -> bool:
        row = fetch_prepared(self._drained_sql, {})
        return bool(row and row[0])

    can_stand_by = True

    def stand_by(self, drainer: str, *, channel: str, seconds: float) -> None:
        """Mark DRAINER as standing by until the database's time plus SECONDS, listening on
        CHANNEL (the caller LISTENs on it first)."""
        t = self._tables
        fetch_prepared(
            f"""INSERT INTO {t["drainer"]} (name, until, standby, channel)
            VALUES (%(name)s, statement_timestamp() + make_interval(secs => %(seconds)s), true,
                %(channel)s)
            ON CONFLICT (name) DO UPDATE SET until = excluded.until, standby = true,
                channel = excluded.channel
            RETURNING 1""",
            {"name": drainer, "seconds": float(seconds), "channel": channel},
        )

    @cached_property
    def _hand_off_sql(self) -> str:
        t = self._tables
        return f"""
        WITH picked AS (
            UPDATE {t["drainer"]} SET standby = false
            WHERE name = (
                SELECT name FROM {t["drainer"]}
                WHERE standby AND until > statement_timestamp()
                LIMIT 1 FOR UPDATE SKIP LOCKED
            )
            RETURNING channel
        ), notified AS (
            SELECT pg_notify(channel, %(payload)s) FROM picked
        )
        SELECT (SELECT count(*) FROM notified) > 0,
            EXISTS (SELECT 1 FROM {t["drainer"]} WHERE until > statement_timestamp())
        """

    def hand_off(self, payload: str) -> tuple[bool, bool]:
        row = fetch_prepared(self._hand_off_sql, {"payload": payload})
        assert row is not None
        return bool(row[0]), bool(row[1])

    # --- reads ------------------------------------------------------------------------------

    @cached_property
    def _task_for_client_sql(self) -> str:
        names = ", ".join(self.q(column.name) for column in task_columns())
        return (
            f"SELECT {names} FROM {self._tables['task']} "
            "WHERE id = %(task_id)s AND client_id = %(client_id)s"
        )

    def task_for_client(self, client_id: int, task_id: str) -> Task | None:
        # Every tasks/get: prepared, on a plain psycopg cursor (Django's cursor wrapper and
        # client-side binding cost more than the read).
        row = fetch_prepared(
            self._task_for_client_sql, {"task_id": task_id, "client_id": client_id}
        )
        return None if row is None else task_from_row(self.db, task_columns(), row)

    # --- the end of a leg -------------------------------------------------------------------

    @cache  # noqa: B019 (one instance per process)
    def _end_ctes(self, names: tuple[str, ...]) -> str:
        t = self._tables
        assignments = "".join(f", {self.q(name)} = %({name})s" for name in names)
        questions = seams.pending_questions().closing_statement()
        ended = _event_insert(t["event"], """
    SELECT task_id, kind, actor_type, actor, old_status, new_status, detail, %(now)s
    FROM (
        SELECT 1 AS n, id AS task_id, %(kind)s AS kind, %(worker)s AS actor_type,
            %(actor)s AS actor, %(working)s AS old_status, %(to)s AS new_status,
            %(detail)s::jsonb AS detail
        FROM ended
        UNION ALL
        SELECT 2, %(task_id)s, %(input_closed)s, %(system)s, '', '', '',
            jsonb_build_object('keys', (SELECT jsonb_agg(key ORDER BY key) FROM closed),
                               'reason', %(to)s)
        WHERE EXISTS (SELECT 1 FROM closed)
    ) AS rows
    ORDER BY n""")  # fmt: skip
        return f"""ended AS (
    UPDATE {t["task"]} SET status = %(to)s, updated_at = %(now)s, finished_at = %(now)s,
        lease_owner = '', lease_expires_at = NULL,
        stored_bytes = stored_bytes + %(grow)s::bigint{assignments}
    WHERE id = %(task_id)s AND status = %(working)s AND lease_owner = %(owner)s
        AND leg = %(leg)s AND lease_expires_at > statement_timestamp()
    RETURNING id, tool_name, created_at, client_id
), closed AS (
    {questions.sql}
), written AS (
    {ended}
), messaged AS (
    -- outbox.write_for_task: the client's webhook endpoints subscribed to the event (one
    -- probe of an empty partial index for a client without any)
    INSERT INTO {t["outbox"]} (channel, kind, message_id, task_id, endpoint_id, recipient,
        detail, created_at, retry_from, due_at, attempts, last_error)
    SELECT %(webhook)s, %(hook_event)s, 'msg_' || replace(gen_random_uuid()::text, '-', ''),
        ended.id, hook.id, '', '{{}}'::jsonb, %(now)s, %(now)s, %(now)s, 0, ''
    FROM ended JOIN {t["endpoint"]} AS hook ON hook.client_id = ended.client_id
    WHERE hook.enabled AND hook.events @> %(hook_events)s::jsonb
)"""

    @cache  # noqa: B019 (one instance per process)
    def _end_leased_sql(self, names: tuple[str, ...]) -> str:
        return f"WITH {self._end_ctes(names)}\nSELECT tool_name, created_at FROM ended"

    # The end with the look for the next record (``LookAfterEnd``). The two touch different
    # task rows: the ended one is leased by this leg in the statement's snapshot, which a
    # claim requires it not to be.
    @cache  # noqa: B019 (one instance per process)
    def _end_and_look_sql(self, names: tuple[str, ...]) -> str:
        return (
            f"WITH {self._end_ctes(names)}, {self._next_ctes('next_owner')}\n"
            "SELECT (SELECT tool_name FROM ended), (SELECT created_at FROM ended), "
            f"{self._next_columns}"
        )

    def end_leased(self, ending: Ending) -> Ended | None:
        # One statement, so one round trip and atomic without a transaction block.
        e = ending
        params: dict[str, Any] = {
            name: _task_field(name).get_db_prep_save(value, connection=self.db)
            for name, value in e.fields.items()
        }
        params.update(
            seams.pending_questions().closing_statement().params,
            task_id=e.task_id,
            to=e.status.value,
            grow=e.grow,
            owner=e.owner,
            leg=e.leg,
            kind=e.kind.value,
            actor=e.actor,
            detail=Jsonb(e.detail),
            now=e.now,
            working=Status.WORKING.value,
            worker=Actor.WORKER.value,
            system=Actor.SYSTEM.value,
            input_closed=EventKind.INPUT_CLOSED.value,
            webhook=Channel.WEBHOOK.value,
            hook_event=outbox.WEBHOOK_EVENT_OF[e.kind].value,
            hook_events=Jsonb([outbox.WEBHOOK_EVENT_OF[e.kind].value]),
        )
        names = tuple(sorted(e.fields))
        look = look_after_end.get()
        if (
            look is None
            or look.looked is not None
            or look.task_id != e.task_id
            or self.db.in_atomic_block  # the look's claim would wait for the block's commit
            or time.monotonic() >= look.deadline
        ):
            row = fetch_prepared(self._end_leased_sql(names), params)
            return None if row is None else Ended(tool_name=row[0], created_at=row[1])
        params.update(
            next_owner=look.owner,
            lease=float(look.lease_seconds),
            drainer=look.drainer,
            window=float(look.window),
            floor=look.floor,
            standby=look.standby_seconds(),
            channel=look.channel,
        )
        look.sent = time.monotonic()
        row = fetch_prepared(self._end_and_look_sql(names), params)
        assert row is not None  # always one row
        look.looked = self._looked(look.owner, row[2:])
        return None if row[0] is None else Ended(tool_name=row[0], created_at=row[1])


def _origin(value: Any) -> dict[str, Any]:
    # jsonb arrives decoded from psycopg; SQLite's raw cursor hands back the JSON text.
    if isinstance(value, str):
        value = json.loads(value)
    return value if isinstance(value, dict) else {}


def _task_field(name: str) -> Field[Any, Any]:
    field = Task._meta.get_field(name)
    assert isinstance(field, Field)
    return field


@cache
def hot_path() -> Portable:
    """The implementation for this process's database: the one place that asks."""
    if connections[DEFAULT_DB_ALIAS].vendor == "postgresql":
        return PostgreSQL()
    return Portable()
