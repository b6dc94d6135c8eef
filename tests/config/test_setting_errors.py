"""A malformed setting ends every entry point (manage.py, gunicorn, the Celery worker and beat)
with one line on standard error that names the variable, its value unless secret and what it
accepts, and a non-zero status: no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.config.test_settings import run
from tests.live import BIN, free_port


def manage(env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return run([sys.executable, "manage.py", "check"], env, tmp_path)


def the_one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The line a malformed setting ended RESULT with, after checking that it is all there is."""
    assert result.returncode != 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Taskdesk cannot start: ")
    return lines[0]


BAD = "Taskdesk cannot start: "


@pytest.mark.parametrize(
    ("name", "value", "line"),
    [
        ("WEB_THREADS", "abc", "WEB_THREADS must be an integer of at least 1, not 'abc'"),
        ("WEB_THREADS", "0", "WEB_THREADS must be at least 1, not '0'"),
        ("PORT", "70000", "PORT must be at most 65535, not '70000'"),
        # A TASKDESK_PORT that is not a number is left aside (Kubernetes injects tcp://…).
        ("TASKDESK_PORT", "70000", "TASKDESK_PORT must be at most 65535, not '70000'"),
        (
            "DEBUG",
            "maybe",
            "DEBUG must be a boolean (1/0, true/false, yes/no, on/off), not 'maybe'",
        ),
        (
            "TASKDESK_SYNC_MAX_SECONDS",
            "inf",
            "TASKDESK_SYNC_MAX_SECONDS must be a finite number of at least 0.1, not 'inf'",
        ),
        (
            "LOG_LEVEL",
            "loud",
            "LOG_LEVEL must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL, not 'loud'",
        ),
        (
            "BEAT_LOG_LEVEL",
            "quiet",
            "BEAT_LOG_LEVEL must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL, not 'quiet'",
        ),
        ("WORKER_CONCURRENCY", "many", "WORKER_CONCURRENCY must be an integer of at least 1"),
        ("WORKER_NICE", "20", "WORKER_NICE must be at most 19 (the lowest priority), not 20"),
        ("TASKDESK_CALL_RATE", "fast", "TASKDESK_CALL_RATE must be a rate such as 10/second"),
        (
            "TASKDESK_PUBLIC_URL",
            "localhost:8000",
            "TASKDESK_PUBLIC_URL must be an http:// or https:// URL such as "
            "https://taskdesk.example.com, not 'localhost:8000'",
        ),
        (
            "SECRET_KEY_FILE",
            "/nonexistent/key",
            "SECRET_KEY_FILE must name a readable file, not '/nonexistent/key' "
            "(No such file or directory)",
        ),
        (
            "TASKDESK_TOOLSETS",
            "demo,bogus",
            "TASKDESK_TOOLSETS names 'bogus', which is neither a built-in toolset nor an "
            "installed one (available: ",
        ),
    ],
)
def test_a_management_command_ends_with_one_line_naming_the_variable(
    tmp_path, name, value, line
) -> None:  # type: ignore[no-untyped-def]
    env = {name: value} if name != "SECRET_KEY_FILE" else {name: value, "SECRET_KEY": ""}
    assert the_one_line(manage(env, tmp_path)).startswith(BAD + line)


@pytest.mark.parametrize(
    ("name", "value", "shown"),
    [
        (
            "DATABASE_URL",
            "postgres://taskdesk:s3cret@db.internal:notaport/taskdesk",
            "not 'postgres://taskdesk:***@db.internal:notaport/taskdesk'",
        ),
        ("DATABASE_URL", "mysql://taskdesk:s3cret@db/taskdesk", "not 'mysql://taskdesk:***@db/"),
        ("CELERY_BROKER_URL", "kafka://admin:s3cret@kafka:9092", "not 'kafka://admin:***@kafka"),
        ("TASKDESK_CACHE_URL", "memcached://u:s3cret@cache", "not 'memcached://u:***@cache'"),
    ],
)
def test_the_password_of_a_malformed_url_is_not_shown(tmp_path, name, value, shown) -> None:  # type: ignore[no-untyped-def]
    line = the_one_line(manage({name: value}, tmp_path))

    assert line.startswith(f"{BAD}{name} must be ")
    assert shown in line
    assert "s3cret" not in line


def test_a_well_formed_environment_passes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    result = manage({"WEB_THREADS": "8", "PORT": "8001", "BEAT_LOG_LEVEL": "info"}, tmp_path)
    assert result.returncode == 0, result.stderr


@pytest.mark.live
@pytest.mark.parametrize(
    ("name", "value", "line"),
    [
        ("WEB_THREADS", "abc", "WEB_THREADS must be an integer of at least 1, not 'abc'"),
        ("WEB_WORKERS", "0", "WEB_WORKERS must be at least 1, not '0'"),
        ("DEBUG", "maybe", "DEBUG must be a boolean"),
        ("DATABASE_URL", "postgres://u:s3cret@h:x/db", "DATABASE_URL must be a postgres://"),
        (
            "TASKDESK_HEADER_TIMEOUT_SECONDS",
            "abc",
            "TASKDESK_HEADER_TIMEOUT_SECONDS must be a number, not 'abc'",
        ),
        (
            "TASKDESK_READ_BUFFER_BYTES",
            "1000",
            "TASKDESK_READ_BUFFER_BYTES must be at least 2097152, not '1000'",
        ),
        (
            "TASKDESK_READING_PER_ADDRESS",
            "many",
            "TASKDESK_READING_PER_ADDRESS must be an integer of at least 0, not 'many'",
        ),
    ],
)
def test_gunicorn_ends_before_any_web_process_with_one_line(tmp_path, name, value, line) -> None:  # type: ignore[no-untyped-def]
    gunicorn = [str(BIN / "gunicorn"), "config.wsgi", "-c", "config/gunicorn.conf.py"]
    result = run(gunicorn, {name: value, "PORT": str(free_port())}, tmp_path)

    assert the_one_line(result).startswith(BAD + line)
    assert "s3cret" not in result.stderr


@pytest.mark.live
def test_apps_that_cannot_be_set_up_stop_gunicorn_without_a_traceback(
    tmp_path,
) -> None:  # type: ignore[no-untyped-def]
    # The master sets the apps up before it forks a web process (preload_app): it says what
    # is wrong in one line and exits with gunicorn's "application failed to load" status,
    # and no web process is started to fail the same way.
    gunicorn = [str(BIN / "gunicorn"), "config.wsgi", "-c", "config/gunicorn.conf.py"]
    env = {"TASKDESK_TOOLSETS": "bogus", "PORT": str(free_port()), "WEB_WORKERS": "2"}
    result = run(gunicorn, env, tmp_path)

    assert result.returncode == 4, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    named = [line for line in result.stderr.splitlines() if "TASKDESK_TOOLSETS" in line]
    assert len(named) == 1, result.stderr  # said once, by the master
    assert named[0].startswith(f"{BAD}TASKDESK_TOOLSETS names 'bogus', which is neither")
    assert "Booting worker" not in result.stderr, result.stderr


CELERY = {
    "worker": ["worker", "--pool", "solo", "--queues", "nothing", "--loglevel", "INFO"],
    "beat": ["beat", "--loglevel", "INFO"],
}


@pytest.mark.live
@pytest.mark.parametrize("command", ["worker", "beat"])
@pytest.mark.parametrize(
    ("name", "value", "line"),
    [
        ("WEB_THREADS", "abc", "WEB_THREADS must be an integer of at least 1, not 'abc'"),
        ("DATABASE_URL", "postgres://u:s3cret@h:x/db", "DATABASE_URL must be a postgres://"),
        ("TASKDESK_TOOLSETS", "bogus", "TASKDESK_TOOLSETS names 'bogus', which is neither"),
    ],
)
def test_celery_ends_with_one_line(tmp_path, command, name, value, line) -> None:  # type: ignore[no-untyped-def]
    args = [str(BIN / "celery"), "-A", "config", *CELERY[command]]
    if command == "beat":
        args += ["-s", str(tmp_path / "celerybeat-schedule")]
    env = {name: value, "CELERY_BROKER_URL": "filesystem://", "TASKDESK_BROKER_DIR": str(tmp_path)}
    result = run(args, env, tmp_path)

    assert the_one_line(result).startswith(BAD + line)
    assert "s3cret" not in result.stderr + result.stdout
