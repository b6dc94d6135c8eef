"""/tasks/export.csv and /tasks/export.jsonl: the list's filters and order, every row read in
batches, only the operator's tenants, formula-looking text defused in the CSV."""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta
from typing import Any

import pytest
from django.http import StreamingHttpResponse
from django.utils import timezone

from tasks_app import listing, transitions
from tasks_app.console import export
from tasks_app.models import Era, Task
from tests.tasks_app.console.test_dashboard import ids_in, make


def body(response: Any) -> str:
    assert isinstance(response, StreamingHttpResponse), type(response)
    return b"".join(response.streaming_content).decode()


def csv_rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def jsonl_records(text: str) -> list[dict[str, Any]]:
    assert text.endswith("\n") or text == ""
    return [json.loads(line) for line in text.splitlines()]


def test_it_needs_a_login(client) -> None:
    response = client.get("/tasks/export.csv?status=failed")
    assert response["Location"] == "/accounts/login/?next=/tasks/export.csv%3Fstatus%3Dfailed"


def test_the_csv_has_the_lists_rows_in_its_order_with_a_header(client, viewer, alice) -> None:
    older = make(alice, idempotency_key="key-1", status_message="step 2 of 5")
    Task.objects.filter(pk=older.pk).update(created_at=timezone.now() - timedelta(hours=2))
    done = make(alice, tool_name="export_report")
    result = {"content": [{"type": "text", "text": "done"}], "isError": False}
    transitions.complete(task_id=done.pk, result=result, actor="w1")
    client.force_login(viewer)  # reading the list is enough to export it

    response = client.get("/tasks/export.csv")

    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"].startswith('attachment; filename="tasks-')
    assert response["Content-Disposition"].endswith('.csv"')
    text = body(response)
    assert text.splitlines()[0] == ",".join(listing.RECORD_COLUMNS)
    rows = csv_rows(text)
    listed = ids_in(client.get("/tasks/").content.decode())
    assert [row["id"] for row in rows] == listed == [done.pk, older.pk]
    first, second = rows
    assert (first["tool"], first["client"], first["status"], first["outcome"]) == (
        "export_report",
        "alice",
        "completed",
        "ok",
    )
    assert first["finished_at"] and float(first["duration_seconds"]) >= 0
    assert (second["status"], second["outcome"], second["finished_at"]) == ("working", "", "")
    assert (second["idempotency_key"], second["status_message"]) == ("key-1", "step 2 of 5")


def test_json_lines_follow_the_filters_and_keep_types(client, operator, alice) -> None:
    echo = make(alice, status_message="=1+1")
    make(alice, tool_name="export_report")
    client.force_login(operator)

    response = client.get("/tasks/export.jsonl?tool=slow_echo")

    assert response["Content-Type"] == "application/jsonl; charset=utf-8"
    (record,) = jsonl_records(body(response))
    assert record["id"] == echo.pk and record["tool"] == "slow_echo"
    assert record["status_message"] == "=1+1"  # JSON keeps the text as it is
    assert record["finished_at"] is None and record["duration_seconds"] is None
    assert record["legs"] == 0 and record["era"] == Era.MODERN == "2026-07-28"


def test_another_tenants_tasks_never_match(client, operator, alice, bob) -> None:
    mine = make(alice, status_message="invoice 7")
    make(bob, status_message="invoice 7")  # globex's, same text
    client.force_login(operator)

    for fmt in ("csv", "jsonl"):
        text = body(client.get(f"/tasks/export.{fmt}?q=invoice"))
        ids = (
            [row["id"] for row in csv_rows(text)]
            if fmt == "csv"
            else [record["id"] for record in jsonl_records(text)]
        )
        assert ids == [mine.pk], fmt


def test_an_operator_of_no_tenant_exports_a_header_only(client, outsider, alice) -> None:
    make(alice)
    client.force_login(outsider)
    response = client.get("/tasks/export.csv")
    # Not an operator at all: the console refuses as it does for the list.
    assert response.status_code == client.get("/tasks/").status_code
    if response.status_code == 200:
        assert csv_rows(body(response)) == []


def test_every_row_is_read_once_across_batches(client, operator, alice, monkeypatch) -> None:
    monkeypatch.setattr(listing, "EXPORT_BATCH", 3)
    tasks = make(alice, n=10)
    now = timezone.now()
    for index, task in enumerate(tasks):  # distinct times, so the order is known
        Task.objects.filter(pk=task.pk).update(created_at=now - timedelta(minutes=index))
    make(alice, tool_name="export_report")  # filtered out
    client.force_login(operator)

    rows = csv_rows(body(client.get("/tasks/export.csv?tool=slow_echo")))
    assert [row["id"] for row in rows] == [task.pk for task in tasks]

    oldest_first = csv_rows(body(client.get("/tasks/export.csv?tool=slow_echo&sort=created")))
    assert [row["id"] for row in oldest_first] == [task.pk for task in reversed(tasks)]


@pytest.mark.parametrize("text", ['=HYPERLINK("http://x")', "+1", "-2+3", "@SUM(A1)", "\tx"])
def test_formula_looking_text_is_defused_in_the_csv(client, operator, alice, text) -> None:
    make(alice, status_message=text, idempotency_key=text)
    client.force_login(operator)
    (row,) = csv_rows(body(client.get("/tasks/export.csv")))
    assert row["status_message"] == "'" + text
    assert row["idempotency_key"] == "'" + text


def test_a_bad_filter_is_refused_with_what_is_wrong(client, operator, alice) -> None:
    make(alice)
    client.force_login(operator)
    response = client.get("/tasks/export.csv?status=exploded")
    assert response.status_code == 400
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert "Unknown status “exploded”" in response.content.decode()


def test_rows_leave_in_pieces_not_one_write_per_row(client, operator, alice, monkeypatch) -> None:
    monkeypatch.setattr(export, "CHUNK_CHARACTERS", 1_000)  # about four rows
    make(alice, n=30)
    client.force_login(operator)
    response = client.get("/tasks/export.jsonl")
    pieces = list(response.streaming_content)
    assert 1 < len(pieces) < 30
    assert len(jsonl_records(b"".join(pieces).decode())) == 30


def test_the_list_links_to_its_export_with_its_filters(client, operator, alice) -> None:
    make(alice)
    client.force_login(operator)
    html = client.get("/tasks/?tool=slow_echo&sort=created").content.decode()
    assert 'href="/tasks/export.csv?tool=slow_echo&amp;sort=created"' in html
    assert 'href="/tasks/export.jsonl?tool=slow_echo&amp;sort=created"' in html
