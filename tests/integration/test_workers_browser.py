"""/workers/ in a real browser (Debian's Chromium driven by Playwright) against a LiveStack:
its real leg worker runs two long legs and has ended a few, legs of three tenants wait, and a
second node, written directly, has gone stale with a leg whose lease is running out. Renders
the README's screenshots, light and dark (TASKDESK_SCREENSHOT_DIR=docs/images to keep them).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from tasks_app.clients import client_get_or_create
from tasks_app.models import Task, TaskEvent, WorkerHeartbeat
from tasks_app.tasks import _beat
from tests.integration.test_dashboard_browser import (  # noqa: F401 - fixtures of this module too
    _orm_beside_playwright,
    browser,
    chromium,
    demo,
    log_in,
    make_user,
)
from tests.integration.worker_helpers import submit, terminal
from tests.live import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.live]


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker) -> Iterator[Any]:  # type: ignore[no-untyped-def]
    from tests.live import live_stack

    # A heartbeat a second, so the page shows each pool at once; no tenant gives way to
    # another (TASKDESK_TENANT_LEG_SHARE), so the legs stay where the picture has them.
    env = {"TASKDESK_HEARTBEAT_SECONDS": "1", "TASKDESK_TENANT_LEG_SHARE": "1"}
    with django_db_blocker.unblock(), live_stack(env=env) as running:
        yield running


def stale_node(shop: Any) -> Task:
    """A second leg worker, on host node-b, whose heartbeat stopped 95 s ago while it ran a
    leg of SHOP's (written first: the page finds the last minute's leg ends after the newest
    event stamped over two minutes ago, and this leg's start is stamped in the past)."""
    now = timezone.now()
    _beat("worker@node-b", "celery", {"host": "node-b", "pid": 4310, "pool": "prefork",
          "concurrency": 2, "pids": [4311, 4312], "former_pids": [],
          "started_at": (now - timedelta(hours=3)).isoformat()})  # fmt: skip
    WorkerHeartbeat.objects.filter(hostname="worker@node-b").update(
        seen_at=now - timedelta(seconds=95)
    )
    owner = "node-b:4311:5f1c0e9a7b2d"
    task = Task.objects.create(client=shop, tool_name="export_report", arguments={"quarter": "Q3"},
                               leg=1, lease_owner=owner,
                               lease_expires_at=now + timedelta(minutes=10))  # fmt: skip
    started = TaskEvent.objects.create(task=task, kind="leg_started", actor_type="worker",
                                       actor=owner, detail={"leg": 1})  # fmt: skip
    TaskEvent.objects.filter(pk=started.pk).update(created_at=now - timedelta(seconds=100))
    return task


def test_screenshots_of_the_workers_page(browser, stack, make_user, demo, tmp_path) -> None:  # noqa: F811
    from playwright.sync_api import expect

    make_user("root", tenant="demo").__class__.objects.filter(username="root").update(
        is_superuser=True, is_staff=True
    )
    shop = client_get_or_create(name="shop-bot", tenant="acme")
    payroll = client_get_or_create(name="payroll", tenant="globex")
    stranded = stale_node(shop)
    # Signed in first (a login takes a while): the legs of the picture must have ended
    # within the last minute when it is taken.
    pages = {scheme: log_in(browser, stack, "root", viewport={"width": 1400, "height": 900},
                            color_scheme=scheme) for scheme in ("light", "dark")}  # fmt: skip
    for i, client in enumerate([demo, shop, demo, payroll, shop]):
        terminal(submit(client, "slow_echo", text=f"quick {i}", seconds=0.3), timeout=30)
    long = [submit(demo, "slow_echo", text="long", seconds=120),
            submit(shop, "slow_echo", text="long", seconds=120)]  # fmt: skip
    wait_for(
        "both long legs running",
        lambda: (
            Task.objects.filter(pk__in=[t.pk for t in long], lease_expires_at__isnull=False)
            .exclude(lease_owner="")
            .count()
            == 2
        ),
        timeout=30,
    )
    for client in (shop, payroll, payroll, demo):  # every pool process is busy: these wait
        submit(client, "slow_echo", text="waiting", seconds=1)
    # The stale node's lease, as it stands a little after its heartbeat stopped.
    Task.objects.filter(pk=stranded.pk).update(
        lease_expires_at=timezone.now() + timedelta(seconds=24)
    )

    out = Path(os.environ.get("TASKDESK_SCREENSHOT_DIR") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    for scheme, name in (("light", "workers.png"), ("dark", "workers-dark.png")):
        page = pages[scheme]
        page.goto(f"{stack.url}/workers/")
        stale = page.locator('article[data-node="worker@node-b"]')
        expect(stale.locator(".status-stale")).to_have_text("Stale")
        expect(stale.locator(f"#running-{stranded.pk} .lease")).to_contain_text("runs out in")
        live = page.locator("article.node:not(.node-stale)").first
        expect(live.locator("table.legs tbody tr")).to_have_count(2)
        expect(live.locator("details.ended summary")).to_contain_text("5 completed")
        expect(page.locator("#backlog-tenants tbody tr")).to_have_count(3)
        live.locator("details.ended summary").click()  # the legs it ended, opened
        page.screenshot(path=str(out / name), full_page=True)
        assert (out / name).stat().st_size > 10_000
        background = page.evaluate("getComputedStyle(document.documentElement).backgroundColor")
        assert (background == "rgb(13, 17, 23)") == (scheme == "dark")
    Task.objects.filter(pk__in=[stranded.pk, *(t.pk for t in long)]).update(
        status="cancelled", lease_owner="", lease_expires_at=None
    )
    WorkerHeartbeat.objects.filter(hostname="worker@node-b").delete()
