"""/tasks/export.csv and /tasks/export.jsonl: the task list as its filters have it, every row,
streamed.

The rows are read in the list's order by keyset, ``listing.EXPORT_BATCH`` at a time, and
written as they are read: an export of a million tasks holds one batch in memory, never the
whole list, and the first bytes leave before the last rows are read. Only the tasks the
operator may see ever match, as on the list.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from django.http import HttpResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.utils import timezone
from django.views.decorators.http import require_GET

from elicitations.selectors import overdue_task_ids
from tasks_app import listing, selectors
from tasks_app.listing import TaskFilters
from tasks_app.operators import HtmxHttpRequest, operator_login_required

# A spreadsheet runs a cell that starts with one of these as a formula (CSV injection): such a
# text cell gets a leading apostrophe in the CSV. JSON Lines keeps every value as it is.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
# The columns of free text (the others are times, numbers and fixed words).
TEXT_COLUMNS = frozenset({"tool", "client", "status_message", "idempotency_key"})
CHUNK_CHARACTERS = 64 * 1024
FORMATS = {
    "csv": "text/csv; charset=utf-8",
    "jsonl": "application/jsonl; charset=utf-8",
}


@require_GET
@operator_login_required
def task_export(request: HtmxHttpRequest, fmt: str) -> HttpResponseBase:
    """The tasks the list's query string matches, in its order, as CSV or JSON Lines."""
    filters = TaskFilters.from_query(request.GET)
    if filters.errors:
        return HttpResponse(
            "\n".join(filters.errors) + "\n", status=400, content_type="text/plain; charset=utf-8"
        )
    attention = selectors.attention_filter(overdue_task_ids=overdue_task_ids())
    unknown = listing.unknown_effects_for(filters)
    tasks = listing.tasks_for_export(user=request.user, filters=filters, attention=attention,
                                     unknown_effects=unknown, fields=listing.RECORD_FIELDS)  # fmt: skip
    records = (listing.task_record(task) for task in tasks)
    lines = csv_lines(records) if fmt == "csv" else jsonl_lines(records)
    return streamed(lines, fmt, "tasks")


class _Line:
    """A file for csv.writer whose write returns the line instead of keeping it."""

    def write(self, text: str) -> str:
        return text


def csv_lines(
    records: Iterable[dict[str, Any]],
    columns: Sequence[str] = listing.RECORD_COLUMNS,
    text_columns: frozenset[str] = TEXT_COLUMNS,
) -> Iterator[str]:
    """The CSV's lines: the header, then a line per record (None is an empty cell; a dict or
    list is its JSON). A TEXT_COLUMNS cell that looks like a formula gets an apostrophe."""
    writer = csv.writer(_Line())
    texts = [index for index, name in enumerate(columns) if name in text_columns]
    yield writer.writerow(columns)
    for record in records:
        row = [_cell(record[name]) for name in columns]
        for index in texts:
            if row[index].startswith(FORMULA_STARTS):
                row[index] = "'" + row[index]
        yield writer.writerow(row)


def _cell(value: Any) -> Any:
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return value


def streamed(lines: Iterable[str], fmt: str, name: str) -> StreamingHttpResponse:
    """LINES as a download named NAME-<now>.FMT, in pieces of CHUNK_CHARACTERS."""
    response = StreamingHttpResponse(chunks(lines, CHUNK_CHARACTERS), content_type=FORMATS[fmt])
    stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
    response["Content-Disposition"] = f'attachment; filename="{name}-{stamp}.{fmt}"'
    response["Cache-Control"] = "no-store"
    return response


def chunks(lines: Iterable[str], size: int) -> Iterator[str]:
    """LINES joined into pieces of about SIZE characters: one write to the client per piece,
    not one per row."""
    piece: list[str] = []
    length = 0
    for line in lines:
        piece.append(line)
        length += len(line)
        if length >= size:
            yield "".join(piece)
            piece, length = [], 0
    if piece:
        yield "".join(piece)


def jsonl_lines(records: Iterable[dict[str, Any]]) -> Iterator[str]:
    for record in records:
        yield json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n"
