"""The pending questions, for ``/metrics``: read from the database when scraped.

``tasks_app.metrics`` explains the two kinds of metrics; this collector is added to the
scrape by the view that serves ``/metrics``.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

from django.db.models import Count, Min, Q
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from elicitations.models import Audience, InputRequest, RequestStatus


def _seconds(later: datetime, earlier: datetime | None) -> float:
    return 0.0 if earlier is None else max((later - earlier).total_seconds(), 0.0)


class PendingQuestionsCollector(Collector):
    """Pending input requests by audience: how many, the oldest's age, and those past their
    deadline (the deadline sweeper should have settled them within one sweep)."""

    def collect(self) -> Iterator[Metric]:
        now = timezone.now()
        overdue = Q(deadline__lt=now)
        # One GROUP BY on the partial index of pending requests.
        rows: dict[str, dict[str, Any]] = {
            row["audience"]: dict(row)
            for row in InputRequest.objects.filter(status=RequestStatus.PENDING)
            .order_by()
            .values("audience")
            .annotate(
                n=Count("pk"),
                oldest=Min("created_at"),
                overdue=Count("pk", filter=overdue),
                earliest_deadline=Min("deadline", filter=overdue),
            )
        }
        families = {
            "pending": GaugeMetricFamily(
                "taskdesk_input_requests_pending",
                "Questions waiting for an answer, by who may answer them.",
                labels=["audience"],
            ),
            "oldest": GaugeMetricFamily(
                "taskdesk_input_requests_oldest_pending_age_seconds",
                "Age of the oldest pending question (0 when there is none).",
                labels=["audience"],
            ),
            "overdue": GaugeMetricFamily(
                "taskdesk_input_requests_overdue",
                "Pending questions whose deadline has passed.",
                labels=["audience"],
            ),
            "past": GaugeMetricFamily(
                "taskdesk_input_requests_most_overdue_seconds",
                "How far past its deadline the most overdue pending question is (0: none).",
                labels=["audience"],
            ),
        }
        for audience in Audience.values:
            row = rows.get(audience, {})
            families["pending"].add_metric([audience], row.get("n", 0))
            families["oldest"].add_metric([audience], _seconds(now, row.get("oldest")))
            families["overdue"].add_metric([audience], row.get("overdue", 0))
            families["past"].add_metric([audience], _seconds(now, row.get("earliest_deadline")))
        yield from families.values()
