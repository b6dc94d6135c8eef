"""Counts that stay cheap at millions of rows: exact up to a limit, PostgreSQL's planner's
estimate beyond it (SQLite: exact). The console's count tiles and /metrics' task gauges use
them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Model, QuerySet


@dataclass(frozen=True)
class Count:
    value: int
    estimate: bool = False


def capped_count(
    qs: QuerySet[Any], exact_up_to: int, *, guess_first: bool = True, guess: int | None = None
) -> Count:
    """QS's row count: exact up to EXACT_UP_TO rows; past that, PostgreSQL's estimate.

    On PostgreSQL the planner is asked first (an EXPLAIN, which reads no rows): a count it
    expects above the limit is not counted at all, which is what keeps the counts of a
    million rows cheap (counting even the capped rows of a filter that matches few of many
    rows walks an index for thousands of entries). GUESS is that estimate when the caller
    has it already (``ColumnStatistics.rows_with``): no EXPLAIN then.
    """
    postgres = connections[qs.db].vendor == "postgresql"
    if postgres and guess is None and guess_first:
        guess = planner_estimate(qs)
    if postgres and guess is not None and guess > exact_up_to:
        return Count(guess, estimate=True)
    capped = qs.values("pk")[: exact_up_to + 1].count()
    if capped <= exact_up_to:
        return Count(capped)
    if not postgres:
        return Count(qs.count())
    if guess is None:
        guess = planner_estimate(qs)
    return Count(max(guess, exact_up_to + 1), estimate=True)  # not below what was counted


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


@dataclass(frozen=True)
class ColumnStatistics:
    """What PostgreSQL's statistics say of one column of a table: the rows the table holds
    (the last ANALYZE's count, scaled to the table's size now, as the planner scales it), the
    share of them holding each of the column's most common values, and the share the planner
    gives any other value."""

    rows: int
    shares: Mapping[str, float]
    other_share: float

    def rows_with(self, value: str) -> int:
        """The planner's estimate of ``WHERE column = VALUE``, without asking it."""
        return round(self.rows * self.shares.get(value, self.other_share))


# One statement for what the planner reads: pg_class's row count and pages as of the last
# VACUUM or ANALYZE, the table's pages now, and the column's entry in pg_stats (the view that
# shows each column to whoever may read it).
_COLUMN_STATISTICS = """
SELECT c.reltuples, c.relpages, pg_relation_size(c.oid) / current_setting('block_size')::int,
       s.null_frac, s.n_distinct, s.most_common_vals::text::text[], s.most_common_freqs
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_stats s
    ON s.schemaname = n.nspname AND s.tablename = c.relname AND s.attname = %s
    AND NOT s.inherited
WHERE c.oid = %s::regclass
"""


def column_statistics(
    model: type[Model], field: str, *, using: str = DEFAULT_DB_ALIAS
) -> ColumnStatistics | None:
    """PostgreSQL's statistics of MODEL's FIELD: the estimates of the rows holding each of
    its values, for the price of one catalog query instead of an EXPLAIN each. None where
    there are none to read: SQLite keeps no such statistics, and PostgreSQL has none for a
    table ANALYZE has not read yet (or read empty)."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return None
    column = {f.name: f.column for f in model._meta.concrete_fields}[field]
    table = connection.ops.quote_name(model._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(_COLUMN_STATISTICS, [column, table])
        row = cursor.fetchone()
    if row is None:
        return None
    reltuples, relpages, pages, null_frac, n_distinct, values, freqs = row
    if null_frac is None or reltuples < 0 or relpages <= 0:
        return None
    rows = reltuples / relpages * pages
    values, freqs = values or [], freqs or []
    # A value not among the most common ones: the planner's var_eq_const, which spreads what
    # the common values and NULL leave over the column's other distinct values, and never
    # puts it above the least common of the listed values.
    other = min(max(1.0 - sum(freqs) - null_frac, 0.0), 1.0)
    distinct = n_distinct if n_distinct >= 0 else -n_distinct * rows
    if distinct - len(freqs) > 1:
        other /= distinct - len(freqs)
    if freqs:
        other = min(other, freqs[-1])
    return ColumnStatistics(round(rows), dict(zip(values, freqs, strict=True)), other)
