"""/workers/: the worker nodes, the legs each runs and ended in the last minute, beat, and the
legs waiting per queue and per tenant; scoped to the operator's tenants, refreshed by a poll."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from tasks_app.models import Dispatch, Task, TaskEvent, WorkerHeartbeat
from tasks_app.tasks import _beat, heartbeat_job

STALE = 60


@pytest.fixture(autouse=True)
def _stale_after(settings):  # type: ignore[no-untyped-def]
    settings.TASKDESK_WORKER_STALE_SECONDS = STALE


@pytest.fixture
def root(django_user_model):  # type: ignore[no-untyped-def]
    """A superuser: every tenant's legs and backlog."""
    return django_user_model.objects.create_superuser("root", password="pw-root-123")


def node(name: str, *, queues: str = "celery", ago: float = 2, **detail: Any) -> None:
    """The heartbeat row of worker NAME (``NAME@HOST``, host w1 unless DETAIL says), as its
    heartbeat thread writes it, AGO seconds old."""
    fields = {"host": name.rpartition("@")[2], "pid": 100, "pool": "prefork", "concurrency": 2,
              "pids": [101, 102], "former_pids": [], "started_at": timezone.now().isoformat()}  # fmt: skip
    _beat(name, queues, {**fields, **detail})
    seen = timezone.now() - timedelta(seconds=ago)
    WorkerHeartbeat.objects.filter(hostname=name).update(seen_at=seen)


def running(client, process: str, *, tool: str = "slow_echo", for_s: float = 12,  # type: ignore[no-untyped-def]
            lease_s: float = 20) -> Task:  # fmt: skip
    """A task whose leg runs in PROCESS (``host:pid``) since FOR_S seconds; its lease runs out
    in LEASE_S seconds."""
    now = timezone.now()
    owner = f"{process}:0123456789ab"
    task = Task.objects.create(client=client, tool_name=tool, arguments={}, leg=1,
                               lease_owner=owner,
                               lease_expires_at=now + timedelta(seconds=lease_s))  # fmt: skip
    started = TaskEvent.objects.create(task=task, kind="leg_started", actor_type="worker",
                                       actor=owner, detail={"leg": 1})  # fmt: skip
    TaskEvent.objects.filter(pk=started.pk).update(created_at=now - timedelta(seconds=for_s))
    return task


def ended(client, process: str, kind: str = "completed", *, ago: float = 10,  # type: ignore[no-untyped-def]
          tool: str = "slow_echo", actor_type: str = "worker") -> Task:  # fmt: skip
    """A task whose leg in PROCESS ended AGO seconds ago with an event KIND."""
    owner = f"{process}:ba9876543210"
    task = Task.objects.create(client=client, tool_name=tool, arguments={}, leg=1)
    at = timezone.now() - timedelta(seconds=ago)
    started = TaskEvent.objects.create(task=task, kind="leg_started", actor_type="worker",
                                       actor=owner)  # fmt: skip
    TaskEvent.objects.filter(pk=started.pk).update(created_at=at - timedelta(seconds=3))
    if kind == "lease_expired":  # the sweeper's, naming the dead leg's owner
        end = TaskEvent.objects.create(task=task, kind=kind, actor_type="system",
                                       detail={"owner": owner, "leg": 1})  # fmt: skip
    else:
        end = TaskEvent.objects.create(task=task, kind=kind, actor_type=actor_type, actor=owner)
    TaskEvent.objects.filter(pk=end.pk).update(created_at=at)
    return task


def waiting(client, ago: float) -> Dispatch:  # type: ignore[no-untyped-def]
    task = Task.objects.create(client=client, tool_name="slow_echo", arguments={})
    record = Dispatch.objects.create(task=task, tenant=client.tenant, reason="accepted")
    Dispatch.objects.filter(pk=record.pk).update(created_at=timezone.now() - timedelta(seconds=ago))
    return record


def card(html: str, name: str) -> str:
    """The card of node NAME on the page."""
    found = re.search(rf'<article[^>]*data-node="{re.escape(name)}".*?</article>', html, re.S)
    assert found, f"no card of {name}"
    return found.group(0)


def page(client) -> str:  # type: ignore[no-untyped-def]
    response = client.get("/workers/")
    assert response.status_code == 200
    return response.content.decode()


def test_it_needs_a_login(client) -> None:
    assert client.get("/workers/")["Location"] == "/accounts/login/?next=/workers/"


def test_it_is_refused_to_a_user_who_may_see_no_tasks(client, outsider) -> None:
    client.force_login(outsider)
    assert client.get("/workers/").status_code == 403
    assert "Workers</a>" not in client.get("/inbox/").content.decode()


def test_a_superuser_sees_each_node_with_its_pool_and_the_legs_it_runs(
    client, root, alice, bob
) -> None:
    node("worker@w1")
    node("worker@w2", pids=[201, 202])
    node("control@w1", queues="control", pids=[111], concurrency=1)
    ours = running(alice, "w1:101", tool="export_report", for_s=47)
    theirs = running(bob, "w2:202")
    client.force_login(root)

    html = page(client)

    first, second = card(html, "worker@w1"), card(html, "worker@w2")
    assert ours.pk in first and theirs.pk not in first
    assert theirs.pk in second and ours.pk not in second
    assert "prefork \N{MULTIPLICATION SIGN} 2" in first and "main 100, pool 101 102" in first
    assert '<td class="mono">export_report</td>' in first and "<td>acme</td>" in first
    assert '<td class="span">45 s</td>' in first  # running for 47 s, in 5 s steps
    assert "<td>globex</td>" in second
    assert "Stale" not in first and "Lease</th>" not in first  # fresh: no leases shown
    control = card(html, "control@w1")
    assert "Control worker and beat" in html and "Runs no leg" not in control
    assert 'aria-current="page">Workers</a>' in html
    assert "3 workers · 2 legs running" in " ".join(html.split())


def test_a_tenant_operator_sees_every_node_but_only_their_tenants_legs(
    client, viewer, alice, bob
) -> None:
    node("worker@w1")
    ours = running(alice, "w1:101")
    theirs = running(bob, "w1:102", tool="globex_payroll")
    gone = ended(bob, "w1:102", tool="globex_payroll")
    waiting(bob, ago=300)
    waiting(alice, ago=20)
    client.force_login(viewer)

    html = page(client)

    assert ours.pk in card(html, "worker@w1")
    for secret in (theirs.pk, gone.pk, "globex", "globex_payroll"):
        assert secret not in html
    assert "1 leg running · 0 ended" in " ".join(html.split())
    assert re.search(r'id="queue-celery".*?<td class="count">1</td>', html, re.S)
    assert "(legs of your tenants)" in html


def test_a_stale_node_is_marked_and_its_legs_say_when_their_leases_run_out(
    client, root, alice
) -> None:
    node("worker@w1", ago=STALE + 15)
    node("worker@w2")
    frozen = running(alice, "w1:101", lease_s=22)
    late = running(alice, "w1:102", lease_s=-7)
    client.force_login(root)

    html = page(client)

    stale = card(html, "worker@w1")
    assert (
        'class="node node-stale"' in stale
        and '<span class="status status-stale">Stale</span>' in stale
    )
    assert "Heartbeat <time" in stale and "1 min ago</time>: the worker may be stopped" in stale
    assert re.search(rf'id="running-{frozen.pk}".*?runs out in 20 s</td>', stale, re.S)
    assert re.search(rf'id="running-{late.pk}".*?ran out 5 s ago</td>', stale, re.S)
    assert "Stale" not in card(html, "worker@w2")
    assert "2 workers, <strong" in html and "1 stale</strong>" in html


def test_the_legs_ended_in_the_last_minute_are_counted_on_their_node(client, root, alice) -> None:
    node("worker@w1", former_pids=[99])
    ended(alice, "w1:101", ago=200)  # before the clock margin: below the events read
    ended(alice, "w1:101", ago=90)  # read, but too long ago
    ended(alice, "w1:102", "leg_suspended", ago=40)
    ended(alice, "w1:99", "lease_expired", ago=20)  # a process replaced since
    done = ended(alice, "w1:101", ago=10)
    ended(alice, "w1:101", "cancelled", actor_type="operator")  # no leg's end
    dead = running(alice, "w1:99")  # its process died: the lease runs out
    client.force_login(root)

    html = page(client)

    w1 = card(html, "worker@w1")
    summary = "Ended in the last minute: 3 (1 completed, 1 lease expired, 1 suspended)"
    assert summary in w1
    assert re.search(rf'data-task="{done.pk}".*?completed</span> <span class="muted">10 s ago, '
                     r"after under 5 s · process 101", w1, re.S)  # fmt: skip
    assert re.search(rf'id="running-{dead.pk}".*?99 <span class="status status-failed">gone'
                     r".*?runs out in", w1, re.S)  # fmt: skip


def test_legs_of_no_known_worker_are_listed_apart(client, root, alice) -> None:
    node("worker@w1")
    stray = running(alice, "web7:4242")
    ended(alice, "web7:4242")
    client.force_login(root)

    html = page(client)

    assert stray.pk not in card(html, "worker@w1")
    apart = html[html.index('id="elsewhere"') :]
    assert stray.pk in apart and "web7:4242" in apart and "Ended in the last minute: 1." in apart


def test_the_backlog_per_queue_and_per_tenant_with_the_oldest_waiting(
    client, root, alice, bob
) -> None:
    node("worker@w1", ago=STALE + 1)
    node("worker@w2")
    node("control@w1", queues="control")
    for ago in (130, 30, 20):  # the oldest record has the smallest id
        waiting(alice, ago=ago)
    waiting(bob, ago=12)
    taken = waiting(bob, ago=900)
    Dispatch.objects.filter(pk=taken.pk).update(consumed_at=timezone.now())
    client.force_login(root)

    html = page(client)

    celery = re.search(r'<tr id="queue-celery">.*?</tr>', html, re.S).group(0)  # type: ignore[union-attr]
    assert "2 workers, <span" in celery and "1 fresh" in celery
    assert '<td class="count">4</td>' in celery and '<td class="span">2 min</td>' in celery
    control = re.search(r'<tr id="queue-control">.*?</tr>', html, re.S).group(0)  # type: ignore[union-attr]
    assert "the broker alone counts them" in control
    tenants = re.findall(r'<tr data-tenant="(\w+)">.*?"count">(\d+)<.*?"span">([^<]+)<', html, re.S)
    assert tenants == [("acme", "3", "2 min"), ("globex", "1", "10 s")]
    assert "4 waiting, the oldest for 2 min" in " ".join(html.split())


def test_beat_is_shown_and_marked_when_stale(client, root) -> None:
    host = heartbeat_job()
    client.force_login(root)
    html = page(client)
    assert f'data-beat="{host}"' in html and "Heartbeat job last run" in html
    assert "No control worker has reported" in html

    WorkerHeartbeat.objects.filter(hostname=host).update(
        seen_at=timezone.now() - timedelta(seconds=STALE + 60)
    )
    html = page(client)
    assert "beat is not sending the periodic jobs" in html


def test_rows_not_heard_from_for_a_day_are_left_out(client, root) -> None:
    node("worker@old", ago=2 * 86400)
    node("worker@w1")
    client.force_login(root)
    html = page(client)
    assert 'data-node="worker@old"' not in html
    assert "1 worker row not heard from for over a day is not shown." in html


def test_the_poll_answers_204_while_nothing_shown_changes(client, root, alice) -> None:
    node("worker@w1", ago=0)
    client.force_login(root)
    html = page(client)
    poll = re.search(r'hx-get="([^"]+)"', html).group(1).replace("&amp;", "&")  # type: ignore[union-attr]

    assert client.get(poll, headers={"HX-Request": "true"}).status_code == 204

    leg = running(alice, "w1:101")
    again = client.get(poll, headers={"HX-Request": "true"})
    assert again.status_code == 200
    region = again.content.decode()
    assert region.lstrip().startswith('<div id="workers"') and leg.pk in region
    assert "<html" not in region


def test_the_page_reads_as_many_queries_for_many_legs_as_for_one(client, root, alice) -> None:
    node("worker@w1", pids=list(range(101, 131)))
    running(alice, "w1:101")
    ended(alice, "w1:101")
    waiting(alice, ago=5)
    client.force_login(root)
    page(client)
    with CaptureQueriesContext(connection) as one:
        page(client)
    for pid in range(102, 131):
        running(alice, f"w1:{pid}")
        ended(alice, f"w1:{pid}")
        waiting(alice, ago=5)
    with CaptureQueriesContext(connection) as many:
        html = page(client)
    assert html.count('id="running-') == 30
    assert len(many.captured_queries) == len(one.captured_queries)
