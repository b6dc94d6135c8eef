"""The example alert rules and Grafana dashboard under deploy/ use metrics that exist.

promtool is not installed here, so the rules are checked as YAML with the expected alerts,
and every metric name an expression uses must be one /metrics serves.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from tasks_app import metrics
from tasks_app.models import WorkerHeartbeat

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
METRIC = re.compile(r"\btaskdesk_[a-z_]+\b")


def served(client) -> set[str]:  # type: ignore[no-untyped-def]
    """Every sample name /metrics can serve: the database gauges as scraped, and each
    counter's and histogram's series (present once a process has counted something)."""
    now = timezone.now()
    WorkerHeartbeat.objects.create(hostname="worker@w1", seen_at=now, queues="celery")
    WorkerHeartbeat.objects.create(hostname="control@w1", seen_at=now, queues="control")
    WorkerHeartbeat.objects.create(hostname="w1", seen_at=now, queues=WorkerHeartbeat.BEAT)
    text = client.get("/metrics").content.decode()
    names = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    for counter in (metrics.TASKS_ACCEPTED, metrics.MCP_REQUESTS):
        names.add(f"{counter._name}_total")
    for histogram in (metrics.TASK_DURATION, metrics.LEG_DURATION, metrics.MCP_REQUEST_DURATION):
        names.update(f"{histogram._name}{suffix}" for suffix in ("_bucket", "_count", "_sum"))
    return names


def test_the_alert_rules_are_the_seven_the_docs_name_each_with_its_runbook(client, db) -> None:  # type: ignore[no-untyped-def]
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())

    (group,) = rules["groups"]
    alerts = {rule["alert"]: rule for rule in group["rules"]}
    assert list(alerts) == [
        "TaskdeskUnknownEffectsWaiting",
        "TaskdeskQuestionPastDeadline",
        "TaskdeskNoWorkerHeartbeat",
        "TaskdeskDispatchBacklogGrowing",
        "TaskdeskDown",
        "TaskdeskDatabaseDown",
        "TaskdeskErrorRate",
    ]
    operations = (DEPLOY.parent / "docs" / "operations.md").read_text()
    anchors = {
        "#" + re.sub(r"[^a-z0-9 -]", "", heading.lower()).replace(" ", "-")
        for heading in re.findall(r"^#+ (.+)$", operations, re.MULTILINE)
    }
    for name, rule in alerts.items():
        page, _, anchor = rule["annotations"]["runbook_url"].partition("#")
        assert page == "docs/operations.md" and f"#{anchor}" in anchors, name
    known = served(client) | {"up"}  # Prometheus' own series of each scrape
    for name, rule in alerts.items():
        assert {"expr", "for", "labels", "annotations"} <= rule.keys(), name
        assert rule["labels"]["severity"] in {"warning", "critical"}
        used = set(METRIC.findall(rule["expr"])) | set(re.findall(r"\bup(?=\{)", rule["expr"]))
        assert used, name
        assert used <= known, (name, used - known)
    # The heartbeat alert fires on any role going missing, not only on all of them: beat
    # dead while the control worker runs included.
    heartbeat = alerts["TaskdeskNoWorkerHeartbeat"]["expr"]
    assert "by (role)" in heartbeat
    assert WorkerHeartbeat.ROLES == ("legs", "control", "beat")
    for role in WorkerHeartbeat.ROLES:
        assert f'absent(taskdesk_worker_heartbeat_age_seconds{{role="{role}"}})' in heartbeat


def test_the_grafana_dashboard_uses_served_metrics(client, db) -> None:  # type: ignore[no-untyped-def]
    dashboard = json.loads((DEPLOY / "grafana" / "taskdesk.json").read_text())

    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    used = {name for expr in exprs for name in METRIC.findall(expr)}
    known = served(client)
    assert used <= known, used - known
    # Every metric family the issue names is on a panel.
    for family in (
        "taskdesk_tasks_accepted_total",
        "taskdesk_tasks",
        "taskdesk_task_duration_seconds_bucket",
        "taskdesk_leg_duration_seconds_bucket",
        "taskdesk_dispatch_unpublished",
        "taskdesk_input_requests_pending",
        "taskdesk_effects",
        "taskdesk_mcp_requests_total",
        "taskdesk_mcp_request_duration_seconds_bucket",
        "taskdesk_worker_heartbeat_age_seconds",
    ):
        assert family in used, family
    assert len({panel["id"] for panel in dashboard["panels"]}) == len(dashboard["panels"])
    # The heartbeat panel shows every role /metrics serves, by its label.
    heartbeats = [e for e in exprs if "taskdesk_worker_heartbeat_age_seconds" in e]
    assert heartbeats == ["max by (role) (taskdesk_worker_heartbeat_age_seconds)"]
