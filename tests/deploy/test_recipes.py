"""The deployment recipes under deploy/: systemd units that systemd accepts, a compose file
with the documented layout and a Dockerfile that installs the wheel (neither run: there is
no Docker engine here). Every process they start is a `taskdesk` command (config/cli.py), in
the Procfile's shape: leg workers, and one control worker with beat in a thread."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.conf import settings

from config import cli
from scripts.wheel_smoke import SOURCES
from tests.live import BIN

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "deploy" / "systemd"
COMPOSE = ROOT / "deploy" / "compose.yaml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
# Where the units expect the wheel's virtualenv (docs/deploy.md, "Installing: the wheel").
VENV = "/opt/taskdesk/venv"


def runs(command: list[str]) -> list[str]:
    """What the `taskdesk` COMMAND runs, refusing any other program or a command the CLI does
    not know: a process's own command line with what follows its name added (as
    config/cli.py execs it), or the manage.py command line."""
    program, name, *rest = command
    assert Path(program).name == "taskdesk", command
    if name in cli.PROCESSES:
        return [*cli.PROCESSES[name][0](), *rest]
    assert name in cli.COMMANDS, command
    return ["manage.py", *rest] if name == "manage" else ["manage.py", name, *rest]


def option(command: list[str], name: str) -> str:
    """The value of the option NAME in COMMAND: the last one given wins, as in Celery's."""
    at = max(i for i, word in enumerate(command) if word == name)
    return command[at + 1]


def exec_starts(unit: str) -> list[list[str]]:
    """The command lines of UNIT's ExecStart= (continuation lines joined), as words."""
    text = (UNITS / unit).read_text().replace("\\\n", " ")
    lines = [ln for ln in text.splitlines() if ln.startswith("ExecStart=")]
    return [shlex.split(line.removeprefix("ExecStart=")) for line in lines]


def exec_start(unit: str) -> list[str]:
    """What UNIT's one ExecStart= runs, through the `taskdesk` command of the virtualenv."""
    (command,) = exec_starts(unit)
    assert command[0] == f"{VENV}/bin/taskdesk", command
    return runs(command)


def queues(command: list[str]) -> set[str]:
    """The queues a `celery worker` COMMAND names with --queues (none without it: such a
    worker consumes the default queue alone, and a recipe says which queue it means)."""
    assert "worker" in command, command
    names = option(command, "--queues") if "--queues" in command else ""
    return {name for name in names.split(",") if name}


def routed_queues() -> set[str]:
    """Every queue a job can be sent to: the default one and each queue of the routes."""
    routes = settings.CELERY_TASK_ROUTES
    return {settings.CELERY_TASK_DEFAULT_QUEUE} | {route["queue"] for route in routes.values()}


def celery(command: list[str]) -> str | None:
    """The Celery command (worker, beat) that COMMAND, as runs() gives it, starts; None for
    another program."""
    if command[1:3] != ["-m", "celery"]:
        return None
    return next(word for word in command[5:] if not word.startswith("-"))  # after -A PACKAGE


def sends_the_periodic_jobs(command: list[str]) -> bool:
    """COMMAND is beat, or a worker with beat inside: in a thread (--embed-beat,
    config/control.py; the last of its flags wins) or in a process (Celery's -B)."""
    if celery(command) == "beat":
        return True
    flags = [word for word in command if word in {"--embed-beat", "--no-embed-beat"}]
    inside = "-B" in command or "--beat" in command or flags[-1:] == ["--embed-beat"]
    return celery(command) == "worker" and inside


def test_the_systemd_units_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    # The units expect the wheel installed in /opt/taskdesk/venv; verify them against this
    # checkout's virtualenv, whose `taskdesk` is the same command, so that every program they
    # start must exist.
    for unit in UNITS.glob("*.service"):
        text = unit.read_text().replace(VENV, str(BIN.parent)).replace("/opt/taskdesk", str(ROOT))
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


def test_the_units_run_the_taskdesk_commands_of_the_installed_wheel() -> None:
    units = {unit.name for unit in UNITS.glob("*.service")}
    assert units == {
        "taskdesk-prepare.service",
        "taskdesk-web.service",
        "taskdesk-worker@.service",
        "taskdesk-control.service",
    }
    for unit in units:
        text = (UNITS / unit).read_text()
        assert "EnvironmentFile=/etc/taskdesk/taskdesk.env" in text, unit
        assert "manage.py" not in text and ".venv" not in text, unit
        for command in exec_starts(unit):
            assert command[0] == f"{VENV}/bin/taskdesk", (unit, command)
            runs(command)
    prepare = [runs(command) for command in exec_starts("taskdesk-prepare.service")]
    assert prepare == [
        ["manage.py", "migrate", "--noinput"],
        ["manage.py", "collectstatic", "--noinput", "-v0"],
        ["manage.py", "clear_metrics"],
    ]
    assert exec_start("taskdesk-web.service") == cli.serve_command()
    example = (UNITS / "taskdesk.env.example").read_text()
    assert "SECRET_KEY_FILE=" in example


def test_the_units_run_one_control_worker_with_beat_and_workers_with_distinct_names() -> None:
    control = exec_start("taskdesk-control.service")
    worker = exec_start("taskdesk-worker@.service")
    text = (UNITS / "taskdesk-control.service").read_text()

    # Beat runs in the control worker, which therefore runs on one host only, and comes back
    # whatever ended it (status 70: a job stuck past its hard time limit).
    assert sends_the_periodic_jobs(control) and "EXACTLY ONE host" in text
    assert "Restart=always" in text.splitlines()
    assert celery(control) == celery(worker) == "worker"
    assert not sends_the_periodic_jobs(worker)
    assert option(worker, "-n") == "worker%i@%H"  # the instance number makes it unique
    assert option(control, "-n").startswith("control@")


def test_the_units_run_a_control_worker_and_leg_workers_that_cover_every_routed_queue() -> None:
    control = exec_start("taskdesk-control.service")
    worker = exec_start("taskdesk-worker@.service")

    assert queues(control) == {settings.TASKDESK_CONTROL_QUEUE}
    assert option(control, "--pool") == "solo"  # one job at a time
    assert queues(worker) == {settings.CELERY_TASK_DEFAULT_QUEUE}
    # Every queue a job can be sent to has a unit that consumes it.
    assert queues(control) | queues(worker) == routed_queues()
    # The periodic jobs run on the control worker, never on a leg worker.
    for job in settings.CONTROL_JOBS:
        assert settings.CELERY_TASK_ROUTES[job]["queue"] in queues(control), job
    assert not queues(worker) & queues(control)
    # Its warm shutdown outlasts a control job's hard time limit.
    stop = re.search(r"^TimeoutStopSec=(\d+)$", (UNITS / "taskdesk-control.service").read_text(), re.M)  # fmt: skip
    assert stop and int(stop.group(1)) > settings.TASKDESK_CONTROL_TIME_LIMIT_SECONDS


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


def compose_services() -> dict[str, Any]:
    services: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())["services"]
    return services


def taskdesk_services() -> dict[str, list[str]]:
    """The compose services of the image, each with what its `taskdesk` command runs."""
    return {
        name: runs(service["command"])
        for name, service in compose_services().items()
        if service.get("image") == "taskdesk"
    }


def test_the_compose_file_has_the_documented_layout() -> None:
    services = compose_services()
    expected = {"web1", "web2", "worker1", "worker2", "control", "db", "redis", "migrate"}
    assert set(services) == expected
    commands = taskdesk_services()  # every one a `taskdesk` command the CLI knows
    assert set(commands) == expected - {"db", "redis"}
    assert commands["web1"] == commands["web2"] == cli.serve_command()
    assert commands["migrate"] == ["manage.py", "migrate", "--noinput"]
    workers = [commands["worker1"], commands["worker2"]]
    control = commands["control"]
    assert queues(control) == {settings.TASKDESK_CONTROL_QUEUE}
    assert all(queues(command) == {settings.CELERY_TASK_DEFAULT_QUEUE} for command in workers)
    assert set().union(queues(control), *map(queues, workers)) == routed_queues()
    assert len({option(command, "-n") for command in workers}) == 2
    # The Procfile's shape: one control worker sends the periodic jobs, and nothing else does.
    assert [n for n, c in commands.items() if sends_the_periodic_jobs(c)] == ["control"]
    assert "deploy" not in services["control"]  # no replicas: never more than one
    assert "UNTESTED" in COMPOSE.read_text()
    # The same SECRET_KEY for every process, required.
    assert services["web1"]["environment"]["SECRET_KEY"].startswith("${SECRET_KEY:?")


def dockerfile_stages() -> list[list[str]]:
    """The Dockerfile's stages, each a list of instructions (continuation lines joined,
    comments left out), the first one its FROM."""
    lines = [ln for ln in DOCKERFILE.read_text().splitlines() if not ln.lstrip().startswith("#")]
    instructions = [" ".join(i.split()) for i in "\n".join(lines).replace("\\\n", " ").splitlines()]
    stages: list[list[str]] = []
    for instruction in filter(None, instructions):
        if instruction.upper().startswith("FROM "):
            stages.append([])
        stages[-1].append(instruction)
    return stages


def test_the_dockerfile_builds_the_wheel_and_installs_only_it() -> None:
    build, runtime = dockerfile_stages()
    assert "UNTESTED" in DOCKERFILE.read_text()
    # The build stage: the wheel, from what it is built from (as scripts/wheel_smoke.py
    # copies it out of the checkout).
    alias = build[0].split()[-1]
    assert build[0].split()[-2].upper() == "AS"
    copied = {word.rstrip("/") for i in build if i.startswith("COPY ") for word in i.split()[1:-1]}
    assert set(SOURCES) <= copied, set(SOURCES) - copied
    assert any(re.search(r"\bpip wheel\b.*--no-deps", i) for i in build if i.startswith("RUN "))
    # The build context lets in what the stages copy (a folder as `!NAME/`).
    context = set((ROOT / "deploy" / "Dockerfile.dockerignore").read_text().splitlines())
    for name in [*SOURCES, "constraints.txt"]:
        assert (f"!{name}/" if (ROOT / name).is_dir() else f"!{name}") in context, name
    # The runtime stage: the wheel installed with the constraints, and no source: it copies
    # the build stage's wheel and constraints.txt, nothing else of the checkout.
    assert not [i for i in runtime if i.startswith("ADD ")]
    for words in [i.split()[1:] for i in runtime if i.startswith("COPY ")]:
        sources = [word for word in words[:-1] if not word.startswith("--")]
        if f"--from={alias}" not in words:
            assert sources == ["constraints.txt"], words
    (install,) = [i for i in runtime if re.search(r"\bpip install\b", i)]
    assert re.search(r"pip install .*-c \S*constraints\.txt \S*/taskdesk-\*\.whl", install)
    assert " -e " not in install and "[" not in install  # no editable install, no extras
    assert any("taskdesk manage collectstatic" in i for i in runtime if i.startswith("RUN "))
    (entrypoint,) = [i for i in runtime if i.startswith("ENTRYPOINT ")]
    assert "taskdesk manage clear_metrics" in entrypoint
    assert [i for i in runtime if i.startswith("CMD ")] == ['CMD ["taskdesk", "serve"]']
    # Not root, by a numeric id (Kubernetes' runAsNonRoot checks it), and the var folder.
    (user,) = [i.split()[1] for i in runtime if i.startswith("USER ")]
    assert re.fullmatch(r"[1-9]\d*(:\d+)?", user)
    assert "TASKDESK_VAR_DIR=/var/lib/taskdesk" in " ".join(runtime)


def test_the_connection_sizing_of_the_docs_and_of_compose_agree() -> None:
    """docs/deploy.md's formula for max_connections counts every kind of worker, and the
    compose file sizes its database by the same formula."""
    docs = (ROOT / "docs" / "deploy.md").read_text()
    (formula,) = re.findall(r"size `max_connections`.*?```\n(.*?)\n```", docs, re.S)
    formula = " ".join(formula.split())
    assert "control workers" in formula and "leg workers" in formula
    compose = " ".join(line.lstrip("# ") for line in COMPOSE.read_text().splitlines())
    assert formula in " ".join(compose.split())
