"""A retried step gives its worker back: on a one-process worker, another task's leg runs
while the first task waits for its retry, and the retry then runs on schedule."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks_app.models import Task
from tests.integration.worker_helpers import describe, submit, terminal
from tests.live import live_stack, wait_for
from tests.runtime_toolset import RUNTIME_TOOLSETS

pytestmark = pytest.mark.live


def test_another_task_runs_on_the_only_worker_during_the_backoff(
    transactional_db, alice, settings, tmp_path
):
    settings.TASKDESK_TOOLSETS = RUNTIME_TOOLSETS
    attempts = tmp_path / "attempts.log"
    env = {"TASKDESK_TOOLSETS": ",".join(RUNTIME_TOOLSETS)}
    with live_stack(env=env, worker_concurrency=1):
        flaky = submit(alice, "flaky_fetch", log_path=str(attempts), fail=1, wait=3)

        def waiting() -> bool:
            flaky.refresh_from_db()
            return flaky.status_message == "retrying fetch (attempt 2 of 3) in 3 s"

        wait_for(
            "the retry to be scheduled", waiting, 60, every=0.05, explain=lambda: describe([flaky])
        )
        assert flaky.lease_owner == ""  # the leg ended: the worker is free

        other = terminal(submit(alice, "noop"), timeout=30)
        assert other.status == "completed"
        # It ran before the retry: the flaky step has had one attempt so far.
        assert len(Path(attempts).read_text().splitlines()) == 1
        assert Task.objects.get(pk=flaky.pk).status == "working"

        done = terminal(flaky, timeout=60)
        assert done.result["content"][0]["text"] == "fetched on attempt 2"  # type: ignore[index]
        first, second = (float(line) for line in Path(attempts).read_text().splitlines())
        assert second - first >= 2.5  # the 3 s wait, less the clocks' rounding
