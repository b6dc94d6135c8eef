"""deploy/kubernetes/ and deploy/compose.yaml: valid against the Kubernetes API schemas, and
pointing at what exists: the probe URLs, the worker probe command and its node names, a grace
period longer than a leg's lease."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from django.conf import settings
from django.urls import resolve

from tasks_app import views

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "deploy" / "kubernetes"
KUBERNETES = "1.30"


def documents() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(FOLDER.glob("*.yaml")):
        found += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return found


def kind(name: str) -> list[dict[str, Any]]:
    return [doc for _, doc in documents() if doc["kind"] == name]


def deployment(component: str) -> dict[str, Any]:
    [found] = [
        doc for doc in kind("Deployment")
        if doc["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]  # fmt: skip
    return found


def container(doc: dict[str, Any]) -> dict[str, Any]:
    [only] = doc["spec"]["template"]["spec"]["containers"]
    return dict(only)


@pytest.mark.parametrize(
    ("file", "doc"), [d for d in documents() if d[1]["apiVersion"] != "monitoring.coreos.com/v1"]
)
def test_each_manifest_is_valid_against_the_api_schema(file: str, doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_the_web_probes_are_the_probe_views_and_the_service_reaches_them() -> None:
    web = container(deployment("web"))
    assert resolve(web["livenessProbe"]["httpGet"]["path"]).func == views.livez
    assert resolve(web["readinessProbe"]["httpGet"]["path"]).func == views.readyz
    assert web["args"][:2] == ["gunicorn", "config.wsgi"] and (ROOT / web["args"][3]).is_file()
    [service] = kind("Service")
    assert service["spec"]["ports"][0]["targetPort"] == web["ports"][0]["name"]
    [monitor] = kind("ServiceMonitor")
    [pods] = kind("PodMonitor")
    worker = container(deployment("worker"))
    assert pods["spec"]["podMetricsEndpoints"][0]["port"] == worker["ports"][0]["name"]
    assert {"name": "TASKDESK_WORKER_METRICS_PORT", "value": "9100"} in worker["env"]
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    assert resolve(monitor["spec"]["endpoints"][0]["path"]).func == views.metrics_view
    [secret] = kind("Secret")
    assert monitor["spec"]["endpoints"][0]["bearerTokenSecret"]["key"] in secret["stringData"]


@pytest.mark.parametrize("component", ["worker", "control"])
def test_each_worker_probes_its_own_node_and_outlives_a_lease(component: str) -> None:
    spec = deployment(component)["spec"]["template"]["spec"]
    worker = container(deployment(component))
    node = worker["args"][worker["args"].index("-n") + 1]
    probe = " ".join(worker["livenessProbe"]["exec"]["command"])
    assert node == f"{component}@%h"  # Celery puts the pod's hostname for %h
    assert f'probe_worker --node "{component}@$(hostname)"' in probe
    assert spec["terminationGracePeriodSeconds"] > settings.TASKDESK_LEASE_SECONDS


def test_one_beat_at_a_time_and_the_migration_job() -> None:
    beat = deployment("beat")
    assert (beat["spec"]["replicas"], beat["spec"]["strategy"]["type"]) == (1, "Recreate")
    [job] = kind("Job")
    assert container({"spec": job["spec"]})["args"] == [
        "python",
        "manage.py",
        "migrate",
        "--noinput",
    ]


def test_the_compose_recipe_has_health_checks_and_a_grace_period_longer_than_a_lease() -> None:
    compose = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())
    services = compose["services"]
    grace = re.fullmatch(r"(\d+)s", services["worker1"]["stop_grace_period"])
    assert grace and int(grace.group(1)) > settings.TASKDESK_LEASE_SECONDS
    assert "/readyz" in " ".join(services["web1"]["healthcheck"]["test"])
    for name in ("worker1", "worker2", "control"):
        check = " ".join(services[name]["healthcheck"]["test"])
        node = services[name]["command"][services[name]["command"].index("-n") + 1]
        assert f"probe_worker --node {node.replace('%h', '$$(hostname)')}" in check
