"""What a query of the console's task list says: its filters (and what is wrong with a query
string), its orders with their keys, and the outcomes a completed task is split into."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from typing import Any

from django.db import models
from django.db.models import (
    DurationField,
    ExpressionWrapper,
    F,
    Q,
)
from django.utils.dateparse import parse_datetime

from tasks_app.models import TERMINAL_STATUSES, Status

PAGE_SIZE = 50
COUNT_EXACT_UP_TO = 1_000
# A search shorter than this finds ids by prefix, keys exactly and tools and clients by
# substring, but not keys and status messages by substring: a trigram index needs three.
SEARCH_SUBSTRING_FROM = 3
# How many rows of the list a search reads in order before it asks its indexes instead.
SEARCH_WALK = 10_000


class Outcome(models.TextChoices):
    """What became of a task, beyond its status: the list's ``outcome`` filter."""

    OK = "ok", "No error"
    TOOL_ERROR = "tool_error", "Tool error"
    UNKNOWN_EFFECT = "unknown_effect", "Unknown effect"


# Outcomes that only a completed task has.
COMPLETED_OUTCOMES = frozenset({Outcome.OK, Outcome.TOOL_ERROR})


# --- sorting --------------------------------------------------------------------------------


@dataclass(frozen=True)
class SortKey:
    """One column of a keyset order: a Task field (or the ``duration`` annotation), its
    direction, and how a cursor carries its value (``time``, ``duration`` or ``text``)."""

    field: str
    desc: bool
    kind: str = "text"

    def flipped(self) -> SortKey:
        return replace(self, desc=not self.desc)


@dataclass(frozen=True)
class Segment:
    """A run of the list in one keyset order: the rows WHERE selects, ordered by KEYS (the
    last one unique). STATUSES: the statuses its rows can have (a status filter outside them
    skips the segment instead of scanning an index for rows that cannot be there)."""

    where: Q
    keys: tuple[SortKey, ...]
    statuses: frozenset[str] = frozenset(Status.values)

    def flipped(self) -> Segment:
        return replace(self, keys=tuple(key.flipped() for key in self.keys))


@dataclass(frozen=True)
class Sort:
    """A whitelisted ``?sort=``: one or more segments, read one after the other."""

    name: str
    label: str
    segments: tuple[Segment, ...]

    def reversed(self, name: str = "") -> Sort:
        return Sort(
            name or self.name, self.label, tuple(s.flipped() for s in reversed(self.segments))
        )

    @property
    def uses_duration(self) -> bool:
        return any(k.field == "duration" for s in self.segments for k in s.keys)


_CREATED = SortKey("created_at", True, "time")
_ID = SortKey("id", True)
_FINISHED = Q(finished_at__isnull=False)
_UNFINISHED = Q(finished_at__isnull=True)
_ACTIVE = frozenset(Status.values) - TERMINAL_STATUSES


def _by(name: str, label: str, *keys: SortKey) -> Sort:
    return Sort(name, label, (Segment(Q(), keys),))


def _by_duration(name: str, label: str, *, longest_first: bool) -> Sort:
    # Finished tasks by duration (finished_at - created_at, the task_duration index), then the
    # tasks still running, which have none yet, newest first.
    duration = SortKey("duration", longest_first, "duration")
    return Sort(
        name,
        label,
        (
            Segment(_FINISHED, (duration, SortKey("id", longest_first)), TERMINAL_STATUSES),
            Segment(_UNFINISHED, (_CREATED, _ID), _ACTIVE),
        ),
    )


_NEWEST = _by("-created", "newest first", _CREATED, _ID)
_TOOL = _by("tool", "tool, A to Z", SortKey("tool_name", False), _CREATED, _ID)
_STATUS = _by("status", "status, A to Z", SortKey("status", False), _CREATED, _ID)
DEFAULT_SORT = _NEWEST.name
# Each second name reads its first one's order backwards (an index scanned the other way).
SORTS: dict[str, Sort] = {
    s.name: s
    for s in (
        _NEWEST,
        _NEWEST.reversed("created"),
        _TOOL,
        _TOOL.reversed("-tool"),
        _STATUS,
        _STATUS.reversed("-status"),
        _by_duration("-duration", "longest first", longest_first=True),
        _by_duration("duration", "shortest first", longest_first=False),
    )
}
SORTS["created"] = replace(SORTS["created"], label="oldest first")
SORTS["-tool"] = replace(SORTS["-tool"], label="tool, Z to A")
SORTS["-status"] = replace(SORTS["-status"], label="status, Z to A")

DURATION = ExpressionWrapper(F("finished_at") - F("created_at"), output_field=DurationField())


# --- filters --------------------------------------------------------------------------------


def moment_of(text: str, *, end: bool) -> datetime | None:
    """A ``from`` (END false) or ``to`` value as a bound of [from, to): a date is its day's
    start, or for ``to`` the next day's start (the whole day is in); an ISO date-time is that
    moment (UTC unless it says otherwise), for ``to`` included. None if it is neither."""
    try:
        day = date.fromisoformat(text)
    except ValueError:
        pass
    else:
        start = datetime(day.year, day.month, day.day, tzinfo=UTC)
        return _later(start, timedelta(days=1)) if end else start
    try:
        moment = parse_datetime(text)
    except ValueError:
        return None
    if moment is None:
        return None
    moment = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    return _later(moment, timedelta(microseconds=1)) if end else moment


def _later(moment: datetime, by: timedelta) -> datetime | None:
    try:
        return moment + by
    except OverflowError:  # the end of year 9999
        return None


def choice_of(query: Mapping[str, str], key: str, choices: Sequence[str], errors: list[str]) -> str:
    """QUERY's KEY when it is empty or one of CHOICES; otherwise empty, with a line in ERRORS
    that names the choices."""
    value = query.get(key, "").strip()
    if value and value not in choices:
        errors.append(f"Unknown {key} “{value[:40]}”: choose one of {', '.join(choices)}.")
        return ""
    return value


def dates_of(query: Mapping[str, str], errors: list[str]) -> tuple[str, str]:
    """QUERY's ``from`` and ``to`` as given (up to 40 characters), each left empty, with a line
    in ERRORS, when ``moment_of`` cannot read it."""
    dates = []
    for key, end in (("from", False), ("to", True)):
        text = query.get(key, "").strip()[:40]
        if text and moment_of(text, end=end) is None:
            errors.append(f"“{text}” is not a date (YYYY-MM-DD) or date-time for “{key}”.")
            text = ""
        dates.append(text)
    return dates[0], dates[1]


@dataclass(frozen=True)
class TaskFilters:
    """The list's filters and order, exactly as the query string carries them, and what was
    wrong with it (ERRORS: a value that is not one of the choices, a date that is not one)."""

    status: str = ""
    outcome: str = ""
    tool: str = ""
    client: str = ""
    attention: bool = False
    q: str = ""
    sort: str = DEFAULT_SORT
    created_from: str = ""  # ?from=
    created_to: str = ""  # ?to=
    errors: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> TaskFilters:
        errors: list[str] = []
        status = choice_of(query, "status", Status.values, errors)
        outcome = choice_of(query, "outcome", Outcome.values, errors)
        if outcome in COMPLETED_OUTCOMES and status not in ("", Status.COMPLETED):
            errors.append(f"Outcome “{outcome}” is only for completed tasks, not {status}.")
        sort = query.get("sort", "").strip() or DEFAULT_SORT
        if sort not in SORTS:
            errors.append(f"Unknown sort “{sort[:40]}”: choose one of {', '.join(SORTS)}.")
            sort = DEFAULT_SORT
        created_from, created_to = dates_of(query, errors)
        filters = cls(
            status=status,
            outcome=outcome,
            tool=query.get("tool", "").strip()[:200],
            client=query.get("client", "").strip()[:100],
            attention=query.get("attention", "") == "1",
            q=query.get("q", "").strip()[:255],
            sort=sort,
            created_from=created_from,
            created_to=created_to,
        )
        start, end = filters.created_range
        if start and end and start >= end:
            errors.append("The date range is empty: “from” must come before “to”.")
        return replace(filters, errors=tuple(errors))

    @property
    def created_range(self) -> tuple[datetime | None, datetime | None]:
        """[start, end) of the creation times the list shows (None: open)."""
        start = moment_of(self.created_from, end=False) if self.created_from else None
        end = moment_of(self.created_to, end=True) if self.created_to else None
        return start, end

    def query(self, **changes: Any) -> dict[str, str]:
        """The query-string parameters of these filters (empty ones and the default sort left
        out), with CHANGES (by field name; ``cursor`` too)."""
        values = {**asdict(self), **changes}
        names = {"created_from": "from", "created_to": "to"}
        out = {}
        for name in ("status", "outcome", "tool", "client", "q", "created_from", "created_to"):
            if values[name]:
                out[names.get(name, name)] = str(values[name])
        if values["attention"]:
            out["attention"] = "1"
        if values["sort"] and values["sort"] != DEFAULT_SORT:
            out["sort"] = str(values["sort"])
        if values.get("cursor"):
            out["cursor"] = str(values["cursor"])
        return out

    @property
    def counting(self) -> TaskFilters:
        """The filters the counts follow: tool, client and dates (not status, outcome,
        attention or search, which the counts themselves split the list by)."""
        return TaskFilters(tool=self.tool, client=self.client, created_from=self.created_from,
                           created_to=self.created_to)  # fmt: skip
