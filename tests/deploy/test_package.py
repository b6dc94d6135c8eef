"""The wheel (setup.py, pyproject.toml) and the `taskdesk` command (config/cli.py).

scripts/wheel_smoke.py (in .ci/run) installs the wheel alone and runs a task through it;
these check, in a few seconds, what it ships and that the command runs what the Procfile runs.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from config import cli
from scripts.wheel_smoke import build_wheel
from tests.live import BIN, ROOT


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture
def wheel_files(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


def test_the_wheel_ships_the_settings_package_as_taskdesk_and_never_as_config(wheel_files):
    tops = {name.split("/", 1)[0] for name in wheel_files}
    assert tops == {"taskdesk", "tasks_app", "elicitations", "taskdesk-0.1.0.dist-info"}
    assert {"taskdesk/settings.py", "taskdesk/cli.py", "taskdesk/gunicorn.conf.py"} <= wheel_files
    assert "taskdesk/postgresql/base.py" in wheel_files


def test_the_wheel_ships_templates_static_files_migrations_and_type_information(wheel_files):
    for folder in ("templates", "static"):
        shipped = {f"taskdesk/{p.relative_to(ROOT)}" for p in (ROOT / folder).rglob("*")}
        shipped = {
            name
            for name in shipped
            if (ROOT / name.removeprefix("taskdesk/")).is_file() and "/." not in name
        }
        assert shipped and shipped <= wheel_files, shipped - wheel_files
    for app in ("tasks_app", "elicitations"):
        migrations = {str(p.relative_to(ROOT)) for p in (ROOT / app / "migrations").glob("*.py")}
        assert migrations and migrations <= wheel_files, migrations - wheel_files
    assert {"taskdesk/py.typed", "tasks_app/py.typed", "elicitations/py.typed"} <= wheel_files


def test_the_wheel_declares_the_command_and_the_testing_kit(wheel):
    with zipfile.ZipFile(wheel) as archive:
        entry_points = archive.read("taskdesk-0.1.0.dist-info/entry_points.txt").decode()
    assert "[console_scripts]\ntaskdesk = taskdesk.cli:main\n" in entry_points
    assert "[pytest11]\ntaskdesk = tasks_app.pytest_plugin\n" in entry_points


def test_the_wheel_declares_its_license_and_ships_its_text(wheel):
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read("taskdesk-0.1.0.dist-info/METADATA").decode()
        text = archive.read("taskdesk-0.1.0.dist-info/licenses/LICENSE").decode()
    headers = metadata.split("\n\n", 1)[0].splitlines()
    assert "License-Expression: Apache-2.0" in headers
    assert "License-File: LICENSE" in headers
    assert text == (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text


def test_taskdesk_help_lists_the_commands():
    shown = subprocess.run(
        [str(BIN / "taskdesk"), "--help"], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    listed = re.findall(r"^    (\w+)", shown, re.MULTILINE)
    assert listed == ["serve", "worker", "control", "beat", "migrate", "bootstrap", "manage"]


def test_taskdesk_refuses_an_unknown_command():
    done = subprocess.run(
        [str(BIN / "taskdesk"), "sevre"], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 2
    assert "taskdesk: error: unknown command 'sevre'" in done.stderr


def _procfile(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """The Procfile's commands as its shell runs them with no LOG_* or TASKDESK_VAR_DIR set."""
    lines = (ROOT / "Procfile").read_text().splitlines()
    out = {}
    for line in lines:
        name, command = line.split(":", 1)
        command = command.replace('$([ "$LOG_FORMAT" = json ] && echo --quiet)', "")
        command = command.replace("${LOG_LEVEL:-INFO}", "INFO")
        command = command.replace("${TASKDESK_VAR_DIR:-var}", "var")
        out[name] = shlex.split(command)[1:]  # without `exec`
    for variable in ("LOG_FORMAT", "LOG_LEVEL", "TASKDESK_VAR_DIR"):
        monkeypatch.delenv(variable, raising=False)
    return out


def _as_the_procfile_writes_it(command: list[str]) -> list[str]:
    program = command[2]  # [python, -m, program, ...]
    assert command[:2] == [sys.executable, "-m"]
    return [program, *(a.replace(f"{ROOT}/", "") for a in command[3:])]


def test_each_process_command_runs_what_the_procfile_runs(monkeypatch):
    procfile = _procfile(monkeypatch)
    assert cli.PACKAGE == "config"  # the checkout's name for it
    assert _as_the_procfile_writes_it(cli.serve_command()) == procfile["web"]
    assert _as_the_procfile_writes_it(cli.worker_command()) == procfile["worker"]
    assert _as_the_procfile_writes_it(cli.control_command()) == procfile["control"]
    assert "beat" not in procfile  # the control worker sends the periodic jobs itself


def test_a_json_log_format_quiets_celery_and_the_schedule_follows_the_var_folder(monkeypatch):
    monkeypatch.setenv("LOG_FORMAT", "json")
    monkeypatch.setenv("LOG_LEVEL", "DEBUG")
    monkeypatch.setenv("TASKDESK_VAR_DIR", "/srv/taskdesk")
    beat = cli.beat_command()
    schedule = str(Path("/srv/taskdesk/celerybeat-schedule"))
    assert beat[3:] == ["-A", "config", "--quiet", "beat", "--loglevel", "DEBUG", "-s", schedule]
    control = cli.control_command()
    assert control[control.index("--embed-beat") + 1 : control.index("--loglevel")] == [
        "-s",
        schedule,
    ]
