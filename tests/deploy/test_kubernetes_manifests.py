"""deploy/kubernetes/ and deploy/compose.yaml: valid against the Kubernetes API schemas, and
pointing at what exists: `taskdesk` commands, the probe URLs, the worker probe command and its
node names, a grace period longer than a leg's lease; one control worker with beat inside,
never two at once."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from django.conf import settings
from django.urls import resolve

from config import cli
from tasks_app import views
from tests.deploy.test_recipes import celery, option, queues, runs, sends_the_periodic_jobs

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


def workloads() -> list[dict[str, Any]]:
    return [*kind("Deployment"), *kind("Job")]


def test_every_container_runs_a_taskdesk_command_of_the_image() -> None:
    """The image's entrypoint (deploy/Dockerfile) runs `args`: each a command the installed
    wheel's `taskdesk` knows, never a program of a checkout."""
    for doc in workloads():
        for one in doc["spec"]["template"]["spec"]["containers"]:
            assert "command" not in one, doc["metadata"]["name"]  # the entrypoint stays
            assert one["args"][0] == "taskdesk", doc["metadata"]["name"]
            runs(one["args"])
            probe = one.get("livenessProbe", {}).get("exec", {}).get("command", [])
            assert "manage.py" not in " ".join(probe)


def test_the_web_probes_are_the_probe_views_and_the_service_reaches_them() -> None:
    web = container(deployment("web"))
    assert resolve(web["livenessProbe"]["httpGet"]["path"]).func == views.livez
    assert resolve(web["readinessProbe"]["httpGet"]["path"]).func == views.readyz
    assert runs(web["args"]) == cli.serve_command()
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
    node = option(runs(worker["args"]), "-n")
    probe = " ".join(worker["livenessProbe"]["exec"]["command"])
    assert node == f"{component}@%h"  # Celery puts the pod's hostname for %h
    assert f'exec taskdesk manage probe_worker --node "{component}@$(hostname)"' in probe
    assert spec["terminationGracePeriodSeconds"] > settings.TASKDESK_LEASE_SECONDS


def test_one_control_worker_with_beat_at_a_time_and_the_migration_job() -> None:
    control = deployment("control")
    command = runs(container(control)["args"])
    assert sends_the_periodic_jobs(command) and queues(command) == {settings.TASKDESK_CONTROL_QUEUE}
    # Never two at once, not even during a rollout: each would send every periodic job.
    assert (control["spec"]["replicas"], control["spec"]["strategy"]["type"]) == (1, "Recreate")
    # Nothing else sends them: no beat of its own, no other worker with beat inside.
    senders = [
        doc["metadata"]["name"] for doc in workloads()
        if sends_the_periodic_jobs(runs(container(doc)["args"]))
    ]  # fmt: skip
    assert senders == ["taskdesk-control"]
    assert "beat" not in {
        d["metadata"]["labels"]["app.kubernetes.io/component"] for d in workloads()
    }
    # Its warm shutdown lets the running job end within its hard time limit.
    grace = control["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > settings.TASKDESK_CONTROL_TIME_LIMIT_SECONDS
    [job] = kind("Job")
    assert container({"spec": job["spec"]})["args"] == ["taskdesk", "migrate", "--noinput"]


def seconds(duration: str) -> int:
    found = re.fullmatch(r"(\d+)s", duration)
    assert found, duration
    return int(found.group(1))


def test_the_compose_recipe_has_health_checks_and_a_grace_period_longer_than_a_lease() -> None:
    compose = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())
    services = compose["services"]
    processes = {n: s for n, s in services.items() if s.get("image") == "taskdesk"}
    processes.pop("migrate")
    assert set(processes) == {"web1", "web2", "worker1", "worker2", "control"}
    for name, service in processes.items():
        assert seconds(service["stop_grace_period"]) > settings.TASKDESK_LEASE_SECONDS, name
        assert service["healthcheck"]["test"], name
    control = seconds(services["control"]["stop_grace_period"])
    assert control > settings.TASKDESK_CONTROL_TIME_LIMIT_SECONDS
    for name in ("web1", "web2"):
        assert "/readyz" in " ".join(services[name]["healthcheck"]["test"])
    for name in ("worker1", "worker2", "control"):
        check = " ".join(services[name]["healthcheck"]["test"])
        command = runs(services[name]["command"])
        assert celery(command) == "worker"
        node = option(command, "-n").replace("%h", "$$(hostname)")
        assert f"CMD-SHELL taskdesk manage probe_worker --node {node}" == check
