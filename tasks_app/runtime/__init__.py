"""Running tool functions as journaled legs inside Celery workers.

A leg is one execution of a task's tool function from the top (``legs.run_leg``). It holds a
lease on the task (``leases``), replays the journal of ``ctx.ask`` / ``ctx.effect`` /
``ctx.step`` calls recorded by earlier legs (``context.TaskContext``), records external side
effects in the effects ledger (``effects``), stops at cancellation checkpoints, and ends the
task through ``tasks_app.transitions``. The import graph stays one-way: jobs (``tasks.py``)
→ runtime → transitions → dispatch → models.
"""

from __future__ import annotations

from tasks_app.runtime.context import TaskContext
from tasks_app.runtime.draining import run_waiting_legs
from tasks_app.runtime.effects import (
    RECONCILE_NOTE_MAX,
    NotReconcilable,
    downstream_key,
    mark_unknown_intended_of_finished,
    reconcile_effect,
)
from tasks_app.runtime.leases import forget_stale_drainers, redispatch_expired_leases
from tasks_app.runtime.legs import LegOutcome, job_time_limit, run_leg
from tasks_app.runtime.retries import dispatch_due_retries

__all__ = [
    "RECONCILE_NOTE_MAX",
    "LegOutcome",
    "NotReconcilable",
    "TaskContext",
    "dispatch_due_retries",
    "downstream_key",
    "forget_stale_drainers",
    "job_time_limit",
    "mark_unknown_intended_of_finished",
    "reconcile_effect",
    "redispatch_expired_leases",
    "run_leg",
    "run_waiting_legs",
]
