"""The console's workers page (/workers/): every worker node with its pool and heartbeat, the
legs each runs now and ended in the last minute, beat, and the legs waiting for a worker per
queue and per tenant.

Nodes are shared infrastructure: whoever may see tasks in some tenant sees every node's name,
queues and pool. Legs and the backlog are of tasks: an operator sees those of the tenants where
they may see tasks (``operators.VIEW_TASKS``) and nothing of the others, not even a count; a
superuser sees all.

A leg is placed on the node whose heartbeat names its process. A lease owner is
``host:pid:suffix`` (``runtime.leases.new_owner``), and a worker's heartbeat row keeps its host,
its main process, its pool's processes and the pool processes replaced lately
(``tasks.PoolDetail``). A running leg of a replaced process is one whose process died: its
lease runs out and the sweeper runs the task again.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, Min, Q
from django.db.models.fields.json import KT
from django.utils import timezone

from tasks_app import health, operators
from tasks_app.models import Actor, Dispatch, EventKind, TaskEvent, Tenant, WorkerHeartbeat
from tasks_app.selectors import NotPermitted, client_ids_visible_to, task_rows_visible_to

# Nodes not heard from for this long are left off the page (and counted): a worker stopped
# for good, or renamed, leaves its row behind.
SHOWN_FOR = timedelta(days=1)
ENDED_WITHIN = timedelta(minutes=1)
# Events are stamped by their writers' clocks, and their ids grow with time: the ends of the
# last minute are read after the newest event stamped this much earlier still, so that a
# writer whose clock is behind (up to this much) does not hide the others' ends.
CLOCK_MARGIN = timedelta(minutes=1)
# The newest leg ends of the last minute read at most; past it the page says the counts are
# of these only.
ENDED_READ = 5_000
# The ended legs a node lists, newest first (the rest are counted).
ENDED_LISTED = 5
# Running legs read at most: more than every pool of a large fleet runs at once (a lease left
# by a dead process counts until the sweeper takes it).
RUNNING_READ = 2_000

# How a leg ends in its task's timeline: a leg writes one of these, with its lease owner as
# the actor; a leg that died gets the sweeper's ``lease_expired``, which names the owner in
# its detail. (An operator's or a deadline's ``cancelled`` or ``failed`` is no leg's end.)
LEG_ENDS: dict[str, str] = {
    EventKind.COMPLETED: "completed",
    EventKind.FAILED: "failed",
    EventKind.CANCELLED: "cancelled",
    EventKind.LEG_SUSPENDED: "suspended",
    EventKind.EFFECT_NEEDS_RECONCILIATION: "awaits an operator",
    EventKind.UNDO_FINISHED: "undone",
}
LEASE_EXPIRED = "lease expired"


@dataclass(frozen=True)
class Leg:
    """A leg running now: a task's live (or not yet swept) lease."""

    task_id: str
    tool: str
    tenant: str
    owner: str
    lease_expires_at: datetime | None
    started_at: datetime | None = None  # its leg_started event
    # Its process was replaced in its pool since it started: it died, the lease runs out.
    process_gone: bool = False

    @property
    def pid(self) -> int | None:
        return _place(self.owner)[1]

    @property
    def process(self) -> str:
        """Its host and process id, ``host:pid``."""
        host, pid = _place(self.owner)
        return f"{host}:{pid}"


@dataclass(frozen=True)
class EndedLeg:
    """A leg that ended in the last minute, and how."""

    task_id: str
    tool: str
    tenant: str
    owner: str
    outcome: str
    ended_at: datetime
    started_at: datetime | None = None

    @property
    def pid(self) -> int | None:
        return _place(self.owner)[1]


@dataclass
class Node:
    """A Celery worker, from its heartbeat row, with the legs placed on it."""

    name: str
    role: str  # WorkerHeartbeat.LEGS or CONTROL
    queues: list[str]
    seen_at: datetime
    stale: bool
    host: str
    pool: str
    concurrency: int | None
    pid: int | None
    pids: list[int]
    former_pids: list[int]
    started_at: datetime | None
    running: list[Leg] = field(default_factory=list)
    ended: list[EndedLeg] = field(default_factory=list)  # newest first
    outcomes: Counter[str] = field(default_factory=Counter)

    @property
    def ended_count(self) -> int:
        return sum(self.outcomes.values())

    @property
    def outcome_counts(self) -> list[tuple[str, int]]:
        """How its legs ended in the last minute, the most frequent first. (A template
        cannot call a Counter's methods: it looks a name up as a key first, and finds 0.)"""
        return self.outcomes.most_common()

    @property
    def pool_pids(self) -> list[int]:
        """Its pool's processes, when they are not the main process (solo, threads)."""
        return [] if self.pids == [self.pid] else self.pids

    @property
    def shows_leases(self) -> bool:
        """Whether its legs say when their leases run out: its heartbeat is stale, or a leg's
        process is gone."""
        return self.stale or any(leg.process_gone for leg in self.running)


@dataclass(frozen=True)
class Beat:
    """``heartbeat_job``'s row: beat sent the job and a control worker on HOST ran it."""

    host: str
    seen_at: datetime
    stale: bool


@dataclass(frozen=True)
class Waiting:
    """Legs waiting for a worker (dispatch records no leg took yet) of a tenant or a queue."""

    name: str
    count: int
    oldest_at: datetime | None


@dataclass(frozen=True)
class Queue:
    name: str
    consumers: list[str]  # the nodes that consume it
    fresh: int  # how many of them have a fresh heartbeat
    waiting: Waiting | None  # None: its jobs are not legs, and only the broker counts them


@dataclass(frozen=True)
class Workers:
    now: datetime
    stale_seconds: int
    nodes: list[Node]
    beats: list[Beat]
    elsewhere: list[Leg]  # running legs of no known node's process
    elsewhere_ended: Counter[str]
    ended_cut: bool  # more than ENDED_READ legs ended in the last minute: counted from those
    queues: list[Queue]
    tenants: list[Waiting]
    hidden: int  # nodes not heard from within SHOWN_FOR
    sees_all: bool  # every tenant's legs (a superuser)

    @property
    def leg_nodes(self) -> list[Node]:
        return [node for node in self.nodes if node.role == WorkerHeartbeat.LEGS]

    @property
    def control_nodes(self) -> list[Node]:
        return [node for node in self.nodes if node.role == WorkerHeartbeat.CONTROL]

    @property
    def stale_count(self) -> int:
        return sum(node.stale for node in self.nodes)

    @property
    def running_count(self) -> int:
        return sum(len(node.running) for node in self.nodes) + len(self.elsewhere)

    @property
    def ended_count(self) -> int:
        placed = sum(node.ended_count for node in self.nodes)
        return placed + self.elsewhere_ended_count

    @property
    def elsewhere_ended_count(self) -> int:
        return sum(self.elsewhere_ended.values())

    @property
    def waiting_count(self) -> int:
        return sum(waiting.count for waiting in self.tenants)

    @property
    def oldest_waiting_at(self) -> datetime | None:
        return min((w.oldest_at for w in self.tenants if w.oldest_at), default=None)


def workers_for_operator(*, user: Any, now: datetime | None = None) -> Workers:
    """What /workers/ shows USER. Raise NotPermitted for a user who may see no tenant's
    tasks."""
    tenants = operators.tenants_where(user, operators.VIEW_TASKS)
    if tenants == []:
        raise NotPermitted(operators.VIEW_TASKS)
    now = now or timezone.now()
    nodes, beats, hidden = _nodes(now)
    places = _Places(nodes)
    elsewhere = places.place_running(_running(user))
    ended, cut = _ended(user, now - ENDED_WITHIN)
    elsewhere_ended = places.place_ended(ended)
    _add_starts(nodes, elsewhere)
    waiting = _waiting_by_tenant(tenants)
    return Workers(
        now=now,
        stale_seconds=settings.TASKDESK_WORKER_STALE_SECONDS,
        nodes=nodes,
        beats=beats,
        elsewhere=sorted(elsewhere, key=lambda leg: leg.owner),
        elsewhere_ended=elsewhere_ended,
        ended_cut=cut,
        queues=_queues(nodes, waiting),
        tenants=waiting,
        hidden=hidden,
        sees_all=tenants is None,
    )


def _stale(seen_at: datetime, now: datetime) -> bool:
    return health.heartbeat_stale((now - seen_at).total_seconds())


def _nodes(now: datetime) -> tuple[list[Node], list[Beat], int]:
    """The nodes heard from within SHOWN_FOR, leg workers first, each by name; beat's rows;
    how many rows are older."""
    rows = WorkerHeartbeat.objects.filter(seen_at__gte=now - SHOWN_FOR)
    nodes, beats = [], []
    for row in rows.order_by("hostname"):
        stale = _stale(row.seen_at, now)
        role = WorkerHeartbeat.role_of(row.queues)
        if role == WorkerHeartbeat.BEAT:
            beats.append(Beat(row.hostname, row.seen_at, stale))
        else:
            nodes.append(_node(row, role, stale))
    nodes.sort(key=lambda node: (node.role != WorkerHeartbeat.LEGS, node.name))
    hidden = WorkerHeartbeat.objects.filter(seen_at__lt=now - SHOWN_FOR).count()
    return nodes, beats, hidden


def _node(row: WorkerHeartbeat, role: str, stale: bool) -> Node:
    detail = row.detail if isinstance(row.detail, dict) else {}
    started = detail.get("started_at")
    return Node(
        name=row.hostname,
        role=role,
        queues=[queue for queue in row.queues.split(",") if queue],
        seen_at=row.seen_at,
        stale=stale,
        # A row written before heartbeats had a detail: the host of the node's name.
        host=str(detail.get("host") or row.hostname.rpartition("@")[2]),
        pool=str(detail.get("pool") or ""),
        concurrency=_int(detail.get("concurrency")),
        pid=_int(detail.get("pid")),
        pids=_ints(detail.get("pids")),
        former_pids=_ints(detail.get("former_pids")),
        started_at=datetime.fromisoformat(started) if isinstance(started, str) else None,
    )


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _ints(values: Any) -> list[int]:
    return [v for v in values if _int(v) is not None] if isinstance(values, list) else []


def _place(owner: str) -> tuple[str, int | None]:
    """The host and process id a lease owner names (``host:pid:suffix``)."""
    parts = owner.rsplit(":", 2)
    if len(parts) != 3:
        return owner, None
    try:
        return parts[0], int(parts[1])
    except ValueError:
        return parts[0], None


class _Places:
    """Which node runs each process, by host and process id: its main process and pool
    processes, then the pool processes it replaced lately."""

    def __init__(self, nodes: list[Node]) -> None:
        self.current: dict[tuple[str, int], Node] = {}
        self.former: dict[tuple[str, int], Node] = {}
        for node in nodes:
            for pid in [*node.pids, *([node.pid] if node.pid is not None else [])]:
                self.current[(node.host, pid)] = node
            for pid in node.former_pids:
                self.former.setdefault((node.host, pid), node)

    def of(self, owner: str) -> tuple[Node | None, bool]:
        """The node of lease owner OWNER (None: no node's), and whether its process was
        replaced since."""
        host, pid = _place(owner)
        if pid is None:
            return None, False
        if (host, pid) in self.current:
            return self.current[(host, pid)], False
        node = self.former.get((host, pid))
        return node, node is not None

    def place_running(self, legs: list[Leg]) -> list[Leg]:
        """Put each of LEGS on its node; return those of no node."""
        elsewhere = []
        for leg in legs:
            node, gone = self.of(leg.owner)
            if node is None:
                elsewhere.append(leg)
            else:
                node.running.append(replace(leg, process_gone=gone))
        return elsewhere

    def place_ended(self, legs: list[EndedLeg]) -> Counter[str]:
        """Count each of LEGS (newest first) on its node, listing the newest ENDED_LISTED;
        return the count of those of no node, by outcome."""
        elsewhere: Counter[str] = Counter()
        for leg in legs:
            node, _ = self.of(leg.owner)
            if node is None:
                elsewhere[leg.outcome] += 1
                continue
            node.outcomes[leg.outcome] += 1
            if len(node.ended) < ENDED_LISTED:
                node.ended.append(leg)
        return elsewhere


def _running(user: Any) -> list[Leg]:
    """The legs USER may see that hold a lease now (the task_leased index)."""
    leased = task_rows_visible_to(user).filter(lease_expires_at__isnull=False)
    rows = leased.exclude(lease_owner="").values_list(
        "pk", "tool_name", "client__tenant__slug", "lease_owner", "lease_expires_at"
    )
    return [Leg(*row) for row in rows.order_by("pk")[:RUNNING_READ]]


def _ended(user: Any, since: datetime) -> tuple[list[EndedLeg], bool]:
    """The legs of tasks USER may see that ended from SINCE on, newest first; and whether
    there were more than ENDED_READ of them (only those are returned).

    The timeline has no index on its time (it is read by task), but its ids grow with it: the
    newest event from before SINCE - CLOCK_MARGIN is found by walking the primary key back
    from the end (past two minutes' events), and the ends are read after it."""
    floor = (
        TaskEvent.objects.filter(created_at__lt=since - CLOCK_MARGIN)
        .order_by("-pk")
        .values_list("pk", flat=True)
        .first()
    )
    ends = TaskEvent.objects.filter(
        Q(kind__in=list(LEG_ENDS), actor_type=Actor.WORKER) | Q(kind=EventKind.LEASE_EXPIRED),
        created_at__gte=since,
    )
    if floor is not None:
        ends = ends.filter(pk__gt=floor)
    clients = client_ids_visible_to(user)
    if clients is not None:
        ends = ends.filter(task__client_id__in=clients)
    rows = list(
        ends.annotate(expired_owner=KT("detail__owner"))
        .order_by("-pk")
        .values_list(
            "task_id",
            "task__tool_name",
            "task__client__tenant__slug",
            "kind",
            "actor",
            "expired_owner",
            "created_at",
        )[: ENDED_READ + 1]
    )
    legs = [
        EndedLeg(
            task_id=task_id,
            tool=tool,
            tenant=tenant,
            owner=str(expired_owner or "") if kind == EventKind.LEASE_EXPIRED else actor,
            outcome=LEG_ENDS.get(kind, LEASE_EXPIRED),
            ended_at=at,
        )
        for task_id, tool, tenant, kind, actor, expired_owner, at in rows[:ENDED_READ]
    ]
    return legs, len(rows) > ENDED_READ


def _add_starts(nodes: list[Node], elsewhere: list[Leg]) -> None:
    """Set when each leg the page shows started: its ``leg_started`` event, whose actor is
    the leg's lease owner (read by task: the event_task index)."""
    shown: list[Leg | EndedLeg] = [*elsewhere]
    for node in nodes:
        shown += [*node.running, *node.ended]
    if not shown:
        return
    started = dict(
        TaskEvent.objects.filter(
            task_id__in={leg.task_id for leg in shown},
            kind=EventKind.LEG_STARTED,
            actor__in={leg.owner for leg in shown},
        ).values_list("actor", "created_at")
    )
    elsewhere[:] = [replace(leg, started_at=started.get(leg.owner)) for leg in elsewhere]
    for node in nodes:
        running = [replace(leg, started_at=started.get(leg.owner)) for leg in node.running]
        # Longest running first.
        node.running = sorted(running, key=lambda leg: (leg.started_at is None, leg.started_at))
        node.ended = [replace(leg, started_at=started.get(leg.owner)) for leg in node.ended]


def _waiting_by_tenant(tenants: list[int] | None) -> list[Waiting]:
    """The dispatch records no leg took yet of TENANTS (None: all, and those of no tenant),
    per tenant, the longest waiting first. Counted on the dispatch_waiting_tenant index; the
    oldest record of each is its smallest id."""
    records = Dispatch.objects.filter(consumed_at__isnull=True)
    if tenants is not None:
        records = records.filter(tenant_id__in=tenants)
    groups = list(
        records.order_by().values_list("tenant_id").annotate(n=Count("pk"), first=Min("pk"))
    )
    if not groups:
        return []
    firsts = [first for _, _, first in groups]
    oldest = dict(Dispatch.objects.filter(pk__in=firsts).values_list("pk", "created_at"))
    names = dict(
        Tenant.objects.filter(pk__in=[t for t, _, _ in groups if t]).values_list("pk", "slug")
    )
    waiting = [
        Waiting(names.get(tenant, "") if tenant else "", n, oldest.get(first))
        for tenant, n, first in groups
    ]
    return sorted(waiting, key=lambda w: (w.oldest_at is None, w.oldest_at, w.name))


def _queues(nodes: list[Node], waiting: list[Waiting]) -> list[Queue]:
    """Every queue a node consumes, and the leg and control queues in any case: who consumes
    it and, for the leg queue, the legs waiting (every leg goes there)."""
    legs_queue = settings.CELERY_TASK_DEFAULT_QUEUE
    names = {legs_queue, settings.TASKDESK_CONTROL_QUEUE}
    names.update(queue for node in nodes for queue in node.queues)
    oldest = [w.oldest_at for w in waiting if w.oldest_at is not None]
    legs = Waiting(legs_queue, sum(w.count for w in waiting), min(oldest, default=None))
    queues = []
    for name in sorted(names, key=lambda q: (q != legs_queue, q)):
        consumers = [node for node in nodes if name in node.queues]
        queues.append(
            Queue(
                name=name,
                consumers=[node.name for node in consumers],
                fresh=sum(not node.stale for node in consumers),
                waiting=legs if name == legs_queue else None,
            )
        )
    return queues
