"""A tenant over its share of the running legs while another tenant waits
(``TASKDESK_TENANT_LEG_SHARE``): which leg gives its worker back, on either database. The live
test (tests/integration/test_tenant_share.py) runs it through a real worker."""

from __future__ import annotations

import pytest

from tasks_app.models import Task
from tasks_app.runtime import leases
from tests.tasks_app.runtime.helpers import next_dispatch, submit

pytestmark = pytest.mark.django_db(transaction=True)


def _run(task: Task, owner: str) -> Task:
    claim = leases.claim(task_id=task.pk, dispatch_id=next_dispatch(task), owner=owner)
    assert claim is not None
    return task


def _givers(tasks: list[Task]) -> list[str]:
    return [t.pk for t in tasks if leases.over_share(t.pk, t.client.tenant_id)]


def test_one_leg_of_a_tenant_over_its_share_gives_way_to_a_tenant_holding_nothing(  # type: ignore[no-untyped-def]
    alice, bob, settings
) -> None:
    settings.TASKDESK_TENANT_LEG_SHARE = 0.5
    held = [_run(submit(alice, "noop"), f"w:{i}") for i in range(2)]
    # Nobody else waits: acme may hold every leg.
    assert _givers(held) == []
    waiting = submit(bob, "noop")
    # globex waits with nothing running: one of acme's legs (always the same one) gives way.
    assert _givers(held) == [max(t.pk for t in held)]
    settings.TASKDESK_TENANT_LEG_SHARE = 1  # off
    assert _givers(held) == []
    settings.TASKDESK_TENANT_LEG_SHARE = 0.5
    # Once globex runs a leg and waits for another, acme's two against its one is as even as
    # it gets: nobody gives way (no leg traded back and forth).
    _run(waiting, "w:b")
    submit(bob, "noop")
    assert _givers(held) == []


def test_one_leg_is_always_allowed(alice, bob, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_TENANT_LEG_SHARE = 0.1
    only = _run(submit(alice, "noop"), "w:1")
    submit(bob, "noop")
    assert _givers([only]) == []  # a share of 0.1 of one leg still allows one


def test_a_larger_pool_keeps_the_tenant_at_its_share(alice, bob, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_TENANT_LEG_SHARE = 0.5
    held = [_run(submit(alice, "noop"), f"w:{i}") for i in range(4)]
    submit(bob, "noop")
    # 4 of 4 legs, 2 allowed: the newest of acme's ids goes first, one at a time.
    assert _givers(held) == [max(t.pk for t in held)]
