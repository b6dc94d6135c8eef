"""/tasks/: outcomes (tool errors, unknown effects), search, sorting, the date range, the pick
lists, refusals of what the query string cannot mean, and the favicon."""

from __future__ import annotations

import importlib
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from tasks_app import listing, selectors, transitions
from tasks_app.models import Effect, Status, Task
from tests.tasks_app.console.test_dashboard import ids_in, make

DECLINED = "Refund of p-42 was not approved by an operator: the question was declined"


def counts_in(html: str) -> dict[str, str]:
    return dict(
        re.findall(r'id="count-(\w+)".*?<span class="tile-count"[^>]*>([^<]+)<', html, re.S)
    )


def complete(task: Task, *, error: str = "") -> None:
    """End TASK through the real transition, with a tool error if ERROR is given."""
    text = error or "done"
    result = {"content": [{"type": "text", "text": text}], "isError": bool(error)}
    transitions.complete(task_id=task.pk, result=result, actor="w1")


def test_a_tool_error_has_its_own_badge_filter_and_count(client, operator, alice) -> None:
    plain = make(alice)
    complete(plain)
    declined = make(alice, tool_name="refund_payment", idempotency_key="refund-p-42")
    complete(declined, error=DECLINED)
    older = make(alice, tool_name="refund_payment")
    complete(older, error="Refund of p-7 was not approved")
    Task.objects.filter(pk=older.pk).update(finished_at=timezone.now() - timedelta(hours=25))
    client.force_login(operator)

    html = client.get("/tasks/").content.decode()

    # Counted apart from plain completions; the last 24 h's tool errors need attention.
    counts = counts_in(html)
    assert (counts["completed"], counts["tool_error"], counts["attention"]) == ("1", "2", "1")
    row = re.search(rf'<tr id="row-{declined.pk}" data-outcome="(\w+)">(.*?)</tr>', html, re.S)
    assert row and row.group(1) == "tool_error"
    assert 'class="status status-tool_error"' in row.group(2) and ">Tool error<" in row.group(2)
    assert DECLINED[:80] in row.group(2) and f'title="{DECLINED}"' in row.group(2)
    assert 'class="status status-completed">Completed<' in html  # the plain one

    def listed(query: str) -> list[str]:
        return ids_in(client.get(f"/tasks/?{query}").content.decode())

    assert set(listed("outcome=tool_error")) == {declined.pk, older.pk}
    assert listed("outcome=ok") == [plain.pk]
    assert set(listed("status=completed")) == {plain.pk, declined.pk, older.pk}
    assert listed("attention=1") == [declined.pk]
    assert (
        'id="count-tool_error" class="tile tile-tool_error" href="/tasks/?outcome=tool_error"'
        in html
    )
    assert (
        'id="count-completed" class="tile tile-completed" href="/tasks/?status=completed&amp;outcome=ok"'
        in html
    )
    current = client.get("/tasks/?outcome=tool_error").content.decode()
    assert re.search(r'id="count-tool_error"[^>]*aria-current="true"', current)
    assert '<option value="tool_error" selected>' in current


def test_an_unknown_effect_is_named_in_its_own_colour(client, operator, alice) -> None:
    notice = make(alice, tool_name="send_notice", status_message="An operator must reconcile it")
    Effect.objects.create(
        task=notice, seq=1, name="send_notice", downstream_key="k1", state="unknown"
    )
    settled = make(alice, tool_name="send_notice")
    Effect.objects.create(task=settled, seq=1, name="send_notice", downstream_key="k2",
                          state="confirmed")  # fmt: skip
    client.force_login(operator)

    html = client.get("/tasks/").content.decode()

    row = re.search(rf'<tr id="row-{notice.pk}" data-outcome="(\w+)">(.*?)</tr>', html, re.S)
    assert row and row.group(1) == "unknown_effect"
    assert 'class="status status-effect_unknown"' in row.group(2)
    assert '<span class="effect-name mono">send_notice</span>' in row.group(2)
    assert "An operator must reconcile it" in row.group(2)
    assert f'<tr id="row-{settled.pk}" data-outcome="working">' in html
    assert ids_in(client.get("/tasks/?outcome=unknown_effect").content.decode()) == [notice.pk]


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("status=bogus", "Unknown status “bogus”"),
        ("outcome=bogus", "Unknown outcome “bogus”"),
        ("sort=id", "Unknown sort “id”"),
        ("from=yesterday", "“yesterday” is not a date"),
        ("to=2026-13-01", "“2026-13-01” is not a date"),
        ("to=9999-12-31", "“9999-12-31” is not a date"),
        ("status=failed&outcome=tool_error", "Outcome “tool_error” is only for completed tasks"),
        ("from=2026-12-05&to=2026-12-04", "The date range is empty"),
    ],
)
def test_what_the_query_cannot_mean_is_refused_on_the_page(
    client, operator, alice, query: str, message: str
) -> None:
    make(alice)
    client.force_login(operator)

    response = client.get(f"/tasks/?{query}")

    assert response.status_code == 400
    html = response.content.decode()
    assert 'id="filter-errors" role="alert"' in html and message in html
    assert ids_in(html) == []  # nothing listed as if the filter were not there
    assert 'id="filter-q"' in html  # the form stays, to fix the query


def test_the_date_range_bounds_creation_times(client, operator, alice) -> None:
    tasks = make(alice, 4)
    moments = ["2026-11-30T23:59:59", "2026-12-01T00:00:00", "2026-12-02T12:00:00",
               "2026-12-03T00:00:00"]  # fmt: skip
    for task, moment in zip(tasks, moments, strict=True):
        at = datetime.fromisoformat(moment).replace(tzinfo=UTC)
        Task.objects.filter(pk=task.pk).update(created_at=at)
    client.force_login(operator)

    def listed(query: str) -> set[int]:
        response = client.get(f"/tasks/?{query}")
        assert response.status_code == 200, response.content
        return {[t.pk for t in tasks].index(pk) for pk in ids_in(response.content.decode())}

    assert listed("from=2026-12-01") == {1, 2, 3}
    assert listed("to=2026-12-02") == {0, 1, 2}  # a date includes its whole day
    assert listed("from=2026-12-01&to=2026-12-02") == {1, 2}
    assert listed("from=2026-12-02T12:00:00&to=2026-12-03T00:00") == {2, 3}  # moments included
    assert listed("to=2026-12-02T11:59:59Z") == {0, 1}
    html = client.get("/tasks/?from=2026-12-01&to=2026-12-02T12:00").content.decode()
    assert 'name="from" value="2026-12-01" type="date"' in html
    assert 'name="to" value="2026-12-02T12:00" type="text"' in html  # sent back as it came
    # The counts follow the dates too.
    assert counts_in(html)["working"] == "2"


# --- sorting --------------------------------------------------------------------------------


@pytest.fixture
def sortable(alice) -> list[Task]:  # type: ignore[no-untyped-def]
    """Eleven tasks with ties in every sort key (and ids whose order no collation changes)."""
    base = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    specs = [  # tool, status, created (minutes before base), duration in seconds (None: running)
        ("export_report", Status.COMPLETED, 1, 30),
        ("export_report", Status.FAILED, 2, 5),
        ("refund_payment", Status.COMPLETED, 2, 30),
        ("send_notice", Status.WORKING, 3, None),
        ("export_report", Status.COMPLETED, 4, 120),
        ("refund_payment", Status.CANCELLED, 5, 1),
        ("send_notice", Status.INPUT_REQUIRED, 5, None),
        ("slow_echo", Status.COMPLETED, 6, 30),
        ("slow_echo", Status.WORKING, 7, None),
        ("export_report", Status.COMPLETED, 8, 0.5),
        ("refund_payment", Status.FAILED, 9, 3600),
    ]
    tasks = []
    for i, (tool, status, minutes, seconds) in enumerate(specs):
        created = base - timedelta(minutes=minutes)
        finished = None if seconds is None else created + timedelta(seconds=seconds)
        task = Task.objects.create(id=f"t{i:02d}", client=alice, tool_name=tool, status=status,
                                   arguments={}, finished_at=finished)  # fmt: skip
        Task.objects.filter(pk=task.pk).update(created_at=created)
        tasks.append(Task.objects.get(pk=task.pk))
    return tasks


def expected_order(tasks: list[Task], sort: str) -> list[str]:
    """SORT's order, computed here from the rows (the selectors' definition, independently)."""

    def newest(ts: list[Task]) -> list[Task]:
        return sorted(ts, key=lambda t: (t.created_at, t.pk), reverse=True)

    if sort in ("-created", "created"):
        ordered = newest(tasks)
        return [t.pk for t in (ordered if sort == "-created" else ordered[::-1])]
    if sort in ("tool", "-tool", "status", "-status"):
        field = "tool_name" if "tool" in sort else "status"
        ordered = sorted(newest(tasks), key=lambda t: getattr(t, field))  # stable: newest within
        return [t.pk for t in (ordered if not sort.startswith("-") else ordered[::-1])]
    finished = [t for t in tasks if t.finished_at]
    running = newest([t for t in tasks if not t.finished_at])
    by_duration = sorted(finished, key=lambda t: (t.finished_at - t.created_at, t.pk),
                         reverse=sort == "-duration")  # fmt: skip
    return [t.pk for t in by_duration + running]


def read_pages(client: Any, url: str, link: str) -> list[list[str]]:
    pages = []
    while url:
        html = client.get(url).content.decode()
        pages.append(ids_in(html))
        found = re.search(rf'id="page-{link}" href="([^"]+)"', html)
        url = found.group(1).replace("&amp;", "&") if found else ""
    return pages


@pytest.mark.parametrize("sort", list(listing.SORTS))
def test_every_sort_reads_every_row_once_in_its_order_both_ways(
    client, operator, sortable, monkeypatch, sort: str
) -> None:
    monkeypatch.setattr(listing, "PAGE_SIZE", 3)
    client.force_login(operator)

    pages = read_pages(client, f"/tasks/?sort={sort}", "older")

    assert [row for page in pages for row in page] == expected_order(sortable, sort)
    assert [len(p) for p in pages] == [3, 3, 3, 2]
    # Back up from the last page with "Previous": the same pages, the other way round.
    last = client.get(f"/tasks/?sort={sort}").content.decode()
    for _ in range(3):
        url = re.search(r'id="page-older" href="([^"]+)"', last).group(1).replace("&amp;", "&")
        last = client.get(url).content.decode()
    backwards = read_pages(client, url, "newer")
    assert backwards == pages[::-1]


@pytest.mark.parametrize("walk", [2, 20_000])
@pytest.mark.parametrize("sort", ["-created", "tool", "-duration"])
def test_a_search_finds_the_same_pages_however_far_it_reads_in_order(
    client, operator, sortable, monkeypatch, walk: int, sort: str
) -> None:
    # On PostgreSQL a search first reads SEARCH_WALK rows in order, then asks its indexes: a
    # short walk makes every page take the second way, a long one the first.
    monkeypatch.setattr(listing, "SEARCH_WALK", walk)
    monkeypatch.setattr(listing, "PAGE_SIZE", 2)
    hits = {"t01", "t03", "t04", "t07", "t10"}
    for task in sortable:
        key = f"order-{task.pk}-{'match' if task.pk in hits else 'other'}"
        Task.objects.filter(pk=task.pk).update(idempotency_key=key)
    client.force_login(operator)

    pages = read_pages(client, f"/tasks/?q=MATCH&sort={sort}", "older")

    expected = [pk for pk in expected_order(sortable, sort) if pk in hits]
    assert [row for page in pages for row in page] == expected
    assert [len(p) for p in pages] == [2, 2, 1]


def test_an_operator_whose_tenant_has_no_clients_searches_nothing(
    client, alice, django_user_model
) -> None:
    from tasks_app.models import Tenant
    from tasks_app.operators import grant_role

    make(alice, idempotency_key="order-1")
    gus = django_user_model.objects.create_user(username="gus", password="pw-gus-123")
    Tenant.objects.create(slug="globex-empty").members.add(gus)
    grant_role(gus, "operator")
    client.force_login(gus)
    for q in ("order", "or", Task.objects.get().pk):
        response = client.get("/tasks/", {"q": q})
        assert response.status_code == 200 and ids_in(response.content.decode()) == []


def test_a_sort_keeps_to_the_filters(client, operator, sortable) -> None:
    client.force_login(operator)
    listed = ids_in(client.get("/tasks/?sort=-duration&status=working").content.decode())
    assert listed == ["t03", "t08"]  # only the running segment: newest first
    listed = ids_in(client.get("/tasks/?sort=duration&status=failed").content.decode())
    assert listed == ["t01", "t10"]
    listed = ids_in(client.get("/tasks/?sort=-tool&outcome=ok").content.decode())
    assert listed == ["t07", "t02", "t09", "t04", "t00"]


def test_column_headers_link_to_their_sort_and_say_which_way(client, operator, alice) -> None:
    make(alice)
    client.force_login(operator)

    html = client.get("/tasks/?status=working").content.decode()
    assert re.search(r'aria-sort="descending"><a id="sort-created" class="sort-link" '
                     r'href="/tasks/\?status=working&amp;sort=created"', html)  # fmt: skip
    assert re.search(
        r'aria-sort="none"><a id="sort-tool" [^>]*href="/tasks/\?status=working&amp;sort=tool"',
        html,
    )
    assert "Sorted by newest first." in html

    html = client.get("/tasks/?status=working&sort=tool").content.decode()
    assert re.search(r'aria-sort="ascending"><a id="sort-tool" [^>]*href="[^"]*sort=-tool"', html)
    assert re.search(r'id="sort-created" [^>]*href="/tasks/\?status=working"', html)  # default
    assert 'type="hidden" name="sort" value="tool"' in html  # the form keeps the order
    html = client.get("/tasks/?sort=-duration").content.decode()
    assert re.search(
        r'aria-sort="descending"><a id="sort-duration" [^>]*href="[^"]*sort=duration"', html
    )


def test_a_cursor_of_another_sort_or_a_made_up_one_starts_at_the_top(
    client, operator, sortable
) -> None:
    cursor = listing.ListCursor.of(sortable[4], sort="tool", older=True).encode()
    assert listing.ListCursor.decode(cursor) == listing.ListCursor.of(
        sortable[4], sort="tool", older=True
    )
    assert listing.ListCursor.decode("oW10") is None  # "[]"
    assert listing.ListCursor.decode("o" + "A" * 20) is None
    assert listing.ListCursor.decode(cursor[:-3]) is None
    client.force_login(operator)
    top = ids_in(client.get("/tasks/").content.decode())
    assert ids_in(client.get(f"/tasks/?cursor={cursor}").content.decode()) == top
    for junk in ("nonsense", "o", "x123", cursor[:-3], "n" + cursor[1:] + "=="):
        response = client.get("/tasks/", {"cursor": junk})
        assert response.status_code == 200


# --- the rest of the list -------------------------------------------------------------------


def test_tool_and_client_are_pick_lists_of_what_exists(client, operator, alice, bob) -> None:
    make(alice, tool_name="export_report")
    make(alice, tool_name="slow_echo")
    make(bob, tool_name="slow_echo")
    alice.tenant.clients.create(name="alice-2")
    client.force_login(operator)

    html = client.get("/tasks/").content.decode()

    tool_select = re.search(r'<select id="filter-tool" name="tool">(.*?)</select>', html, re.S)
    assert re.findall(r'value="([^"]*)"', tool_select.group(1)) == [
        "",
        "export_report",
        "slow_echo",
    ]
    client_select = re.search(
        r'<select id="filter-client" name="client">(.*?)</select>', html, re.S
    )
    assert re.findall(r'value="([^"]*)"', client_select.group(1)) == ["", "alice", "alice-2"]
    # A value from a pasted link that no task has is still shown, selected.
    html = client.get("/tasks/?tool=retired_tool").content.decode()
    assert '<option value="retired_tool" selected>' in html
    assert ids_in(html) == []
    assert selectors.tool_names() == ["export_report", "slow_echo"]


def test_times_have_an_iso_title_and_a_short_text_and_durations_show(
    client, operator, alice
) -> None:
    old = make(alice, status=Status.COMPLETED)
    created = datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC)
    Task.objects.filter(pk=old.pk).update(
        created_at=created, finished_at=created + timedelta(seconds=90)
    )
    recent = make(alice)
    Task.objects.filter(pk=recent.pk).update(created_at=timezone.now() - timedelta(minutes=5))
    client.force_login(operator)

    html = client.get("/tasks/").content.decode()

    assert (
        '<time datetime="2025-03-04T05:06:07Z" title="2025-03-04T05:06:07Z">4 Mar 2025</time>'
        in html
    )
    assert re.search(r'title="\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ">5\xa0minutes ago</time>', html)
    assert '<td class="col-duration">1 min 30 s</td>' in html
    assert re.search(r'title="Still running">5 min(utes)?( \d+ s)? so far<', html)


def test_needs_attention_is_red_only_when_a_task_needs_it(client, operator, alice) -> None:
    make(alice)
    client.force_login(operator)
    html = client.get("/tasks/").content.decode()
    assert counts_in(html)["attention"] == "0"
    assert 'class="tile tile-attention"' in html and "tile-alert" not in html

    make(alice, status=Status.FAILED, finished_at=timezone.now())
    html = client.get("/tasks/").content.decode()
    assert 'class="tile tile-attention tile-alert"' in html


def test_the_favicon_is_linked_and_answers(client, operator) -> None:
    client.force_login(operator)
    html = client.get("/tasks/").content.decode()
    assert '<link rel="icon" href="/static/favicon.ico" sizes="32x32">' in html
    assert '<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">' in html

    response = client.get("/favicon.ico")
    assert (response.status_code, response["Location"]) == (302, "/static/favicon.ico")
    assert "max-age=86400" in response["Cache-Control"]


def test_the_migration_marks_tool_errors_stored_before_the_column(alice) -> None:
    from django.apps import apps

    migration = importlib.import_module("tasks_app.migrations.0022_console_outcomes_and_search")
    before = make(alice, status=Status.COMPLETED, result={"content": [], "isError": True})
    fine = make(alice, status=Status.COMPLETED, result={"content": [], "isError": False})
    failed = make(alice, status=Status.FAILED, result=None)

    migration.mark_tool_errors(apps, None)

    marked = set(Task.objects.filter(is_error=True).values_list("pk", flat=True))
    assert marked == {before.pk} and {fine.pk, failed.pk}.isdisjoint(marked)


# --- PostgreSQL: the indexes answer these queries ---------------------------------------


def plan_of(qs: Any) -> str:
    sql, params = qs.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_sort = off")
        cursor.execute(f"EXPLAIN {sql}", params)
        return "\n".join(row[0] for row in cursor.fetchall())


@pytest.mark.postgres
def test_the_search_and_the_duration_sort_can_use_their_indexes(operator, alice) -> None:
    now = timezone.now()
    Task.objects.bulk_create(
        Task(client=alice, tool_name="slow_echo", arguments={}, idempotency_key=f"order-{i}",
             status_message=f"step {i}", status=Status.COMPLETED, finished_at=now,
             is_error=i % 50 == 0)
        for i in range(3000)
    )  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE tasks_app_task")
        # At a few thousand rows the planner prefers reading all keys through the unique
        # index; dropped inside this test's transaction, what is left shows whether the
        # search's expression is the one the trigram index holds.
        cursor.execute("DROP INDEX task_unique_client_idempotency_key")
    search = listing.search_filter(user=operator, q="p-42")
    assert "task_key_trgm" in plan_of(Task.objects.filter(idempotency_key__icontains="p-42"))
    assert "task_message_trgm" in plan_of(Task.objects.filter(status_message__icontains="p-42"))
    assert "Bitmap" in plan_of(Task.objects.filter(search))
    by_duration = (
        Task.objects.filter(finished_at__isnull=False)
        .annotate(duration=listing.DURATION)
        .order_by("-duration", "-id")
    )
    assert "task_duration" in plan_of(by_duration)
    assert "task_tool_error" in plan_of(
        Task.objects.filter(is_error=True).order_by("-created_at", "-id")
    )
