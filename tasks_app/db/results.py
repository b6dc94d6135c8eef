"""What the hot-path operations return (``tasks_app.db.backend``), and the look a leg's end
may make for the next record (``look_after_end``)."""

from __future__ import annotations

import time
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tasks_app.models import EventKind, Status, Task


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
