"""/tasks/: the operator's task list, its counts, filters, search and keyset pages."""

from __future__ import annotations

import re
from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from elicitations import transitions as questions
from tasks_app import listing
from tasks_app.models import Effect, Status, Task

EVIL = '<script>alert("x")</script><img src=x onerror=alert(1)>'


def make(client, n=1, **fields):  # type: ignore[no-untyped-def]
    defaults = {"tool_name": "slow_echo", "arguments": {"text": "hi"}}
    tasks = Task.objects.bulk_create(
        [Task(client=client, **{**defaults, **fields}) for _ in range(n)]
    )
    return tasks[0] if n == 1 else tasks


def ids_in(html: str) -> list[str]:
    return re.findall(r'id="row-([^"]+)"', html)


def test_it_needs_a_login(client) -> None:
    response = client.get("/tasks/?status=failed")
    assert response["Location"] == "/accounts/login/?next=/tasks/%3Fstatus%3Dfailed"


def test_it_lists_the_tenants_tasks_newest_first_with_their_fields(
    client, operator, alice, bob
) -> None:
    older = make(alice, idempotency_key="key-1", status_message="step 2 of 5")
    newer = make(alice, tool_name="export_report")
    Task.objects.filter(pk=older.pk).update(created_at=timezone.now() - timedelta(hours=2))
    theirs = make(bob)
    client.force_login(operator)

    html = client.get("/tasks/").content.decode()

    assert ids_in(html) == [newer.pk, older.pk]
    assert theirs.pk not in html
    assert f'href="/tasks/{older.pk}/"' in html
    assert "key-1" in html and "step 2 of 5" in html and "2\xa0hours ago" in html
    assert '<td class="col-tool mono">export_report</td>' in html
    assert '<td class="col-client">alice</td>' in html


def test_every_status_is_a_count_link_even_at_zero(client, operator, alice) -> None:
    make(alice, 3)
    make(alice, status=Status.FAILED, finished_at=timezone.now())
    client.force_login(operator)

    html = client.get("/tasks/?tool=slow_echo").content.decode()

    counts = dict(
        re.findall(r'id="count-(\w+)".*?<span class="tile-count"[^>]*>([^<]+)<', html, re.S)
    )
    assert counts == {
        "working": "3",
        "input_required": "0",
        "completed": "0",
        "tool_error": "0",
        "failed": "1",
        "cancelled": "0",
        "attention": "1",
    }
    assert 'href="/tasks/?status=cancelled&amp;tool=slow_echo"' in html
    assert 'href="/tasks/?tool=slow_echo&amp;attention=1"' in html
    for value in Status.values:
        assert f'<option value="{value}"' in html


def test_filters_come_from_the_query_string(client, operator, alice) -> None:
    acme_two = alice.tenant.clients.create(name="alice-2")
    working = make(alice)
    failed = make(alice, status=Status.FAILED, finished_at=timezone.now())
    export = make(alice, tool_name="export_report")
    other_client = make(acme_two)
    client.force_login(operator)

    def listed(query: str) -> set[str]:
        return set(ids_in(client.get(f"/tasks/?{query}").content.decode()))

    assert listed("status=failed") == {failed.pk}
    assert listed("status=working&tool=export_report") == {export.pk}
    assert listed("client=alice-2") == {other_client.pk}
    assert listed("") == {working.pk, failed.pk, export.pk, other_client.pk}
    html = client.get("/tasks/?status=failed").content.decode()
    assert '<option value="failed" selected>' in html
    assert (
        'id="count-failed" class="tile tile-failed" href="/tasks/?status=failed" aria-current="true"'
        in html
    )


def test_search_matches_an_id_its_prefix_or_text_in_the_key_tool_client_or_message(
    client, operator, alice, bob
) -> None:
    task = make(alice, idempotency_key="refund-p-42")
    other = make(alice, idempotency_key="order-770", status_message="Generating Q3 rows")
    export = make(alice, tool_name="export_report")
    shop = make(alice.tenant.clients.create(name="shop-bot"))
    theirs = make(bob, idempotency_key="refund-p-42", tool_name="export_report")
    client.force_login(operator)

    def found(q: str) -> set[str]:
        response = client.get("/tasks/", {"q": q})
        assert response.status_code == 200
        return set(ids_in(response.content.decode()))

    assert found(task.pk) == {task.pk}
    assert found(task.pk[:6]) >= {task.pk}
    # Part of a key, in any case; never another tenant's task.
    assert found("p-42") == {task.pk}
    assert found("REFUND-P") == {task.pk}
    assert found("order-77") == {other.pk}
    assert found("q3 rows") == {other.pk}  # the status message
    assert found("export") == {export.pk}  # the tool
    assert found("shop") == {shop.pk}  # the client
    assert found("nothing like it") == set()
    assert theirs.pk not in found(theirs.pk)
    # Under three characters: ids by prefix, keys exactly, tools and clients by name; not
    # text inside a key ("." is in no id, tool or client).
    dotted = make(alice, idempotency_key="x.")
    assert found("x.") == {dotted.pk}
    assert found(".") == set()
    # "ex" is also the start of about one random id in a thousand (ids match in any case).
    ids_like_it = {
        pk
        for pk in Task.objects.filter(client__tenant=alice.tenant).values_list("pk", flat=True)
        if pk.lower().startswith("ex")
    }
    assert found("ex") == {export.pk} | ids_like_it


def test_attention_lists_unknown_effects_overdue_questions_and_recent_failures(
    client, operator, alice
) -> None:
    quiet = make(alice)
    unknown = make(alice)
    Effect.objects.create(task=unknown, seq=1, name="send", downstream_key="k1", state="unknown")
    settled = make(alice)
    Effect.objects.create(task=settled, seq=1, name="send", downstream_key="k2", state="confirmed")
    overdue = make(alice)
    questions.open_request(
        task=overdue,
        ask_key="approve",
        message="Approve?",
        audience="operator",
        deadline=timezone.now() - timedelta(minutes=1),
    )
    failed_now = make(alice, status=Status.FAILED, finished_at=timezone.now())
    make(alice, status=Status.FAILED, finished_at=timezone.now() - timedelta(hours=25))
    client.force_login(operator)

    html = client.get("/tasks/?attention=1").content.decode()

    assert set(ids_in(html)) == {unknown.pk, overdue.pk, failed_now.pk}
    assert quiet.pk not in html
    assert re.search(r'id="count-attention".*?>3<', html, re.S)


def test_pages_are_50_rows_read_by_cursor(client, operator, alice) -> None:
    tasks = make(alice, 120)
    base = timezone.now()
    for i, task in enumerate(tasks):  # distinct times, plus ties that the id must break
        Task.objects.filter(pk=task.pk).update(created_at=base - timedelta(seconds=i // 2))
    expected = list(Task.objects.order_by("-created_at", "-pk").values_list("pk", flat=True))
    client.force_login(operator)

    seen: list[str] = []
    url = "/tasks/?tool=slow_echo"
    pages = []
    while url:
        html = client.get(url).content.decode()
        pages.append(ids_in(html))
        seen += pages[-1]
        older = re.search(r'id="page-older" href="([^"]+)"', html)
        url = older.group(1).replace("&amp;", "&") if older else ""
    assert [len(p) for p in pages] == [50, 50, 20]
    assert seen == expected

    # Back up one page from the last: the second page again.
    html = client.get(
        f"/tasks/?tool=slow_echo&cursor={listing.ListCursor.of(Task.objects.get(pk=pages[2][0]), older=False).encode()}"
    ).content.decode()
    assert ids_in(html) == pages[1]
    assert 'id="page-first"' in html


def test_the_list_query_never_uses_offset(client, operator, alice) -> None:
    make(alice, 60)
    client.force_login(operator)
    first = client.get("/tasks/").content.decode()
    cursor = re.search(r'id="page-older" href="([^"]+)"', first).group(1)
    with CaptureQueriesContext(connection) as queries:
        client.get(cursor.replace("&amp;", "&"))
    assert not any("OFFSET" in q["sql"].upper() for q in queries.captured_queries)


def test_a_task_link_carries_the_list_so_the_task_page_leads_back(client, operator, alice) -> None:
    task = make(alice, idempotency_key="k-9")
    client.force_login(operator)
    html = client.get("/tasks/?status=working&q=k-9").content.decode()
    link = re.search(rf'href="(/tasks/{task.pk}/[^"]*)"', html).group(1).replace("&amp;", "&")
    assert parse_qs(urlsplit(link).query) == {"from": ["status=working&q=k-9"]}

    page = client.get(link).content.decode()
    assert 'id="back-to-list" href="/tasks/?status=working&amp;q=k-9"' in page


def test_the_refresh_answers_204_when_nothing_changed(client, operator, alice) -> None:
    task = make(alice)
    client.force_login(operator)
    part = client.get("/tasks/?status=working", HTTP_HX_REQUEST="true").content.decode()
    assert part.lstrip().startswith('<div id="task-list"') and '<nav class="site-nav"' not in part
    poll = re.search(r'hx-get="([^"]+)"', part).group(1).replace("&amp;", "&")
    assert "status=working" in poll and "since=" in poll

    assert client.get(poll, HTTP_HX_REQUEST="true").status_code == 204
    Task.objects.filter(pk=task.pk).update(status_message="half way", updated_at=timezone.now())
    again = client.get(poll, HTTP_HX_REQUEST="true")
    assert again.status_code == 200 and "half way" in again.content.decode()


def test_tool_and_client_text_is_escaped(client, operator, alice) -> None:
    make(alice, tool_name=EVIL, status_message=EVIL, idempotency_key=EVIL[:40])
    client.force_login(operator)
    html = client.get("/tasks/").content.decode()
    assert "<script>alert" not in html and "<img src=x" not in html


def test_the_throughput_chart_counts_accepted_and_finished_per_minute(
    client, operator, alice
) -> None:
    make(alice, 4)
    make(alice, 2, status=Status.COMPLETED, finished_at=timezone.now())
    client.force_login(operator)
    html = client.get("/tasks/").content.decode()
    assert "<svg" in html and 'class="bar-accepted"' in html and 'class="bar-finished"' in html
    assert re.search(r"6\s+accepted,", html) and re.search(r"2\s+finished", html)
    assert "6 accepted, 2 finished</title>" in html


def test_a_viewer_sees_the_list_and_a_user_without_a_role_sees_nothing(
    client, viewer, alice, django_user_model
) -> None:
    task = make(alice)
    client.force_login(viewer)
    assert ids_in(client.get("/tasks/").content.decode()) == [task.pk]

    nobody = django_user_model.objects.create_user(username="nora", password="pw-nora-123")
    alice.tenant.members.add(nobody)
    client.force_login(nobody)
    assert ids_in(client.get("/tasks/").content.decode()) == []
    assert client.get(f"/tasks/{task.pk}/").status_code == 404


def test_a_superuser_sees_every_tenant(client, alice, bob, django_user_model) -> None:
    ours, theirs = make(alice), make(bob)
    client.force_login(
        django_user_model.objects.create_superuser(username="root", password="pw-root-123")
    )
    assert set(ids_in(client.get("/tasks/").content.decode())) == {ours.pk, theirs.pk}


@pytest.mark.postgres
def test_large_counts_are_estimates_and_say_so(client, operator, alice, monkeypatch) -> None:
    monkeypatch.setattr(listing, "COUNT_EXACT_UP_TO", 5)
    make(alice, 8)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE tasks_app_task")
    client.force_login(operator)
    html = client.get("/tasks/").content.decode()
    assert re.search(r'id="count-working".*?title="An estimate', html, re.S)
    assert "(estimate)" in html
