"""The deployment recipes under deploy/: systemd units that systemd accepts, a compose file
with the documented layout (never run: there is no Docker engine here)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "deploy" / "systemd"


def test_the_systemd_units_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    # The units expect the checkout in /opt/taskdesk; verify them against this one, so that
    # every program they start must exist.
    for unit in UNITS.glob("*.service"):
        text = unit.read_text().replace("/opt/taskdesk", str(ROOT))
        (tmp_path / unit.name).write_text(text)
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


def test_the_compose_file_has_the_documented_layout() -> None:
    compose = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())

    services = compose["services"]
    assert {"web1", "web2", "worker1", "worker2", "beat", "db", "redis", "migrate"} == set(services)
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
