"""Counts that stay cheap at millions of rows: exact up to a limit, PostgreSQL's planner's
estimate beyond it (SQLite: exact). The console's count tiles and /metrics' task gauges use
them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db import connections
from django.db.models import QuerySet


@dataclass(frozen=True)
class Count:
    value: int
    estimate: bool = False


def capped_count(qs: QuerySet[Any], exact_up_to: int, *, guess_first: bool = True) -> Count:
    """QS's row count: exact up to EXACT_UP_TO rows; past that, PostgreSQL's estimate.

    On PostgreSQL the planner is asked first (an EXPLAIN, which reads no rows): a count it
    expects above the limit is not counted at all, which is what keeps the counts of a
    million rows cheap (counting even the capped rows of a filter that matches few of many
    rows walks an index for thousands of entries).
    """
    postgres = connections[qs.db].vendor == "postgresql"
    if postgres and guess_first and (guess := planner_estimate(qs)) > exact_up_to:
        return Count(guess, estimate=True)
    capped = qs.values("pk")[: exact_up_to + 1].count()
    if capped <= exact_up_to:
        return Count(capped)
    if not postgres:
        return Count(qs.count())
    # Never below what was just counted exactly.
    return Count(max(planner_estimate(qs), exact_up_to + 1), estimate=True)


def planner_estimate(qs: QuerySet[Any]) -> int:
    """How many rows PostgreSQL's planner expects QS to return (no row is read)."""
    try:
        sql, params = qs.values("pk").query.sql_with_params()
    except EmptyResultSet:  # e.g. no visible client: nothing to ask about
        return 0
    with connections[qs.db].cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        plan = cursor.fetchone()[0]
    if isinstance(plan, str):
        plan = json.loads(plan)
    return int(plan[0]["Plan"]["Plan Rows"])
