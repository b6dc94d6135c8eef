"""The runtime's own control flow: exceptions that end a leg without being tool errors.

They derive from ``BaseException`` (as ``KeyboardInterrupt`` does) so that a tool's
``except Exception:`` cannot swallow them and carry on as if its leg were still running.
"""

from __future__ import annotations

from typing import Any

# Another leg owns the task now (this one was presumed dead): write nothing more. One class
# for the runtime and ``transitions``, which raises it when such a leg tries to end the task.
from tasks_app.transitions import LeaseLost

__all__ = [
    "AwaitingReconciliation",
    "LeaseLost",
    "LegAborted",
    "LegInterrupt",
    "NotDeterministic",
    "RetryScheduled",
    "Suspended",
    "TimeLimitExceeded",
    "Yielded",
]


class LegInterrupt(BaseException):
    """Base class: unwinds the tool function; ``run_leg`` decides what it means."""


class Suspended(LegInterrupt):
    """The leg asked questions that have no answer yet. The requests, the task's new status
    and the released lease are already committed when this is raised."""


class RetryScheduled(LegInterrupt):
    """A step failed and will be retried: the failed attempt, the status message and the
    released lease are committed, and the next leg is scheduled for when the wait is over."""


class Yielded(RetryScheduled):
    """The leg gave its worker to another tenant's waiting task (``TASKDESK_TENANT_LEG_SHARE``):
    the released lease and a new dispatch record of the task are committed; the next leg
    replays the journal, as after any interrupted leg."""


class AwaitingReconciliation(LegInterrupt):
    """An effect's outcome is unknown and nothing can verify it: an operator must say
    whether it happened. Already recorded (status message, event, lease released)."""


class LegAborted(LegInterrupt):
    """The runtime's own bookkeeping failed (database unreachable, ...). The leg stops
    without touching the task; its lease runs out and the sweeper dispatches a new leg."""


class TimeLimitExceeded(LegInterrupt):
    """The leg ran longer than its tool's ``time_limit``."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"time limit of {seconds:g} s exceeded")
        self.seconds = seconds


class NotDeterministic(LegInterrupt):
    """This leg made a different journaled call than the journal recorded at that position."""

    def __init__(self, message: str, data: dict[str, Any]) -> None:
        super().__init__(message)
        self.message = message
        self.data = data
