"""Running tool functions as journaled legs inside Celery workers.

(The full runtime: leases, replay journal, effects ledger and cancellation checkpoints.)
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def run_leg(*, task_id: str, dispatch_id: int | None = None) -> None:
    raise NotImplementedError("the task runtime is not built yet")


def redispatch_expired_leases() -> int:
    return 0
