"""The deployment recipes under deploy/: systemd units that systemd accepts, a compose file
with the documented layout (never run: there is no Docker engine here)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from django.conf import settings

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "deploy" / "systemd"
COMPOSE = ROOT / "deploy" / "compose.yaml"


def exec_start(unit: str) -> list[str]:
    """The command line of UNIT's ExecStart (continuation lines joined), as words."""
    text = (UNITS / unit).read_text().replace("\\\n", " ")
    (line,) = [ln for ln in text.splitlines() if ln.startswith("ExecStart=")]
    return shlex.split(line.removeprefix("ExecStart="))


def queues(command: list[str]) -> set[str]:
    """The queues a `celery worker` COMMAND names with --queues (none without it: such a
    worker consumes the default queue alone, and a recipe says which queue it means)."""
    assert "worker" in command, command
    names = command[command.index("--queues") + 1] if "--queues" in command else ""
    return {name for name in names.split(",") if name}


def routed_queues() -> set[str]:
    """Every queue a job can be sent to: the default one and each queue of the routes."""
    routes = settings.CELERY_TASK_ROUTES
    return {settings.CELERY_TASK_DEFAULT_QUEUE} | {route["queue"] for route in routes.values()}


def test_the_systemd_units_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    # The units expect the checkout in /opt/taskdesk; verify them against this one, so that
    # every program they start must exist.
    for unit in UNITS.glob("*.service"):
        text = unit.read_text().replace("/opt/taskdesk", str(ROOT))
        (tmp_path / unit.name).write_text(text)
    assert (tmp_path / "taskdesk-control.service").exists()
    template = tmp_path / "taskdesk-worker@.service"
    (tmp_path / "taskdesk-worker@1.service").write_text(template.read_text())
    template.unlink()
    result = subprocess.run(
        [analyze, "verify", "--man=no", *sorted(str(p) for p in tmp_path.glob("*.service"))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout + result.stderr == ""  # an unknown key is only a warning


def test_the_units_run_one_beat_and_workers_with_distinct_names() -> None:
    beat = (UNITS / "taskdesk-beat.service").read_text()
    worker = (UNITS / "taskdesk-worker@.service").read_text()
    prepare = (UNITS / "taskdesk-prepare.service").read_text()

    assert "EXACTLY ONE host" in beat
    assert "-n worker%i@%H" in worker  # the instance number makes the node name unique
    assert "manage.py clear_metrics" in prepare
    for unit in UNITS.glob("*.service"):
        assert "EnvironmentFile=/etc/taskdesk/taskdesk.env" in unit.read_text(), unit.name
    example = (UNITS / "taskdesk.env.example").read_text()
    assert "SECRET_KEY_FILE=" in example


def test_the_units_run_a_control_worker_and_leg_workers_that_cover_every_routed_queue() -> None:
    control = exec_start("taskdesk-control.service")
    worker = exec_start("taskdesk-worker@.service")

    assert queues(control) == {settings.TASKDESK_CONTROL_QUEUE}
    assert control[control.index("--concurrency") + 1] == "1"
    assert "-n" in control and control[control.index("-n") + 1].startswith("control@")
    assert queues(worker) == {settings.CELERY_TASK_DEFAULT_QUEUE}
    # Every queue a job can be sent to has a unit that consumes it.
    assert queues(control) | queues(worker) == routed_queues()
    # The periodic jobs run on the control worker, never on a leg worker.
    for job in settings.CONTROL_JOBS:
        assert settings.CELERY_TASK_ROUTES[job]["queue"] in queues(control), job
    assert not queues(worker) & queues(control)


def test_the_leg_workers_yield_the_cpu_to_the_web_processes_on_a_shared_host() -> None:
    """As a leg worker lowers its own priority (WORKER_NICE), the recipes put leg workers'
    units and containers below the web processes; the control worker and the web keep the
    default."""
    worker = (UNITS / "taskdesk-worker@.service").read_text().splitlines()
    assert "CPUWeight=10" in worker
    for unit in ("taskdesk-web.service", "taskdesk-control.service"):
        text = (UNITS / unit).read_text()
        assert "Nice=" not in text and "CPUWeight=" not in text, unit
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    shares = {name: service.get("cpu_shares") for name, service in services.items()}
    assert shares["worker1"] == shares["worker2"] == 110
    assert shares["web1"] is shares["web2"] is shares["control"] is None


def test_the_compose_file_has_the_documented_layout() -> None:
    compose = yaml.safe_load(COMPOSE.read_text())

    services = compose["services"]
    expected = {"web1", "web2", "worker1", "worker2", "control", "beat", "db", "redis", "migrate"}
    assert set(services) == expected
    workers = [s["command"] for n, s in services.items() if n.startswith("worker")]
    control = services["control"]["command"]
    assert queues(control) == {settings.TASKDESK_CONTROL_QUEUE}
    assert all(queues(command) == {settings.CELERY_TASK_DEFAULT_QUEUE} for command in workers)
    assert set().union(queues(control), *map(queues, workers)) == routed_queues()
    names = [
        s["command"][s["command"].index("-n") + 1]
        for n, s in services.items()
        if n.startswith("worker")
    ]
    assert len(set(names)) == 2
    assert "UNTESTED" in (ROOT / "deploy" / "compose.yaml").read_text()
    assert "UNTESTED" in (ROOT / "deploy" / "Dockerfile").read_text()
    # The same SECRET_KEY for every process, required.
    assert services["web1"]["environment"]["SECRET_KEY"].startswith("${SECRET_KEY:?")


def test_the_connection_sizing_of_the_docs_and_of_compose_agree() -> None:
    """docs/deploy.md's formula for max_connections counts every kind of worker, and the
    compose file sizes its database by the same formula."""
    docs = (ROOT / "docs" / "deploy.md").read_text()
    (formula,) = re.findall(r"size `max_connections`.*?```\n(.*?)\n```", docs, re.S)
    formula = " ".join(formula.split())
    assert "control workers" in formula and "leg workers" in formula
    compose = " ".join(line.lstrip("# ") for line in COMPOSE.read_text().splitlines())
    assert formula in " ".join(compose.split())
