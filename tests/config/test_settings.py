"""Settings come from the environment; a malformed value stops start-up naming the variable."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import forkserver

ROOT = Path(__file__).resolve().parents[2]


# Variables `make` or the test run export that would mask or shape the ones a test sets.
_INHERITED = {
    "DATABASE_URL",
    "CELERY_BROKER_URL",
    "HOST",
    "PORT",
    "TASKDESK_PORT",
    "PROMETHEUS_MULTIPROC_DIR",  # settings exports it, so this process has one
    "LOG_FORMAT",
    "LOG_LEVEL",
    "BEAT_LOG_LEVEL",
    "DJANGO_SETTINGS_MODULE",
}


# Production-like settings, as docs/operations.md's "Production" sets them.
PRODUCTION = {
    "SECRET_KEY": "k" * 64 + "-production-like-secret-key-with-entropy-1234567890",
    "TASKDESK_ALLOWED_HOSTS": "taskdesk.example.com",
    "TASKDESK_ALLOWED_ORIGINS": "https://taskdesk.example.com",
    "TASKDESK_SSL_REDIRECT": "1",
    "TASKDESK_SECURE_COOKIES": "1",
    "TASKDESK_HSTS_SECONDS": "31536000",
    "TASKDESK_BEHIND_TLS_PROXY": "1",
}


def run(
    args: list[str], env: dict[str, str], var: Path, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run ARGS in the project's folder with this environment less _INHERITED, VAR as
    TASKDESK_VAR_DIR, and ENV."""
    full_env = {k: v for k, v in os.environ.items() if k not in _INHERITED}
    full_env |= {"TASKDESK_VAR_DIR": str(var), **env}
    return forkserver.run(args, cwd=ROOT, env=full_env, timeout=timeout)


def run_django(code: str, env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    program = [sys.executable, "-c", f"import django; django.setup(); {code}"]
    return run(program, {"DJANGO_SETTINGS_MODULE": "config.settings", **env}, tmp_path)


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("DEBUG", "maybe", "DEBUG must be a boolean"),
        ("LOG_FORMAT", "xml", "LOG_FORMAT must be text or json, not 'xml'"),
        ("PORT", "eighty", "PORT must be an integer"),
        ("TASKDESK_LEASE_SECONDS", "0", "TASKDESK_LEASE_SECONDS must be at least 1"),
        (
            "TASKDESK_SESSION_IDLE_SECONDS",
            "0",
            "TASKDESK_SESSION_IDLE_SECONDS must be at least 1",
        ),
        ("TASKDESK_MAX_STREAMS", "0", "TASKDESK_MAX_STREAMS must be at least 1"),
        (
            "TASKDESK_QUESTION_DEADLINE_SECONDS",
            "0",
            "TASKDESK_QUESTION_DEADLINE_SECONDS must be at least 1",
        ),
        (
            "TASKDESK_DEMO_EXPORT_SECONDS",
            "nan",
            "TASKDESK_DEMO_EXPORT_SECONDS must be a finite number",
        ),
        (
            "DATABASE_URL",
            "mysql://x@localhost/db",
            "DATABASE_URL must be a postgres:// or sqlite:// URL",
        ),
        (
            "CELERY_BROKER_URL",
            "kafka://localhost",
            "CELERY_BROKER_URL must be redis://, amqp:// or filesystem://",
        ),
        (
            "TASKDESK_ALLOWED_ORIGINS",
            "localhost:8000",
            "TASKDESK_ALLOWED_ORIGINS entries must look like",
        ),
        ("TASKDESK_CALL_RATE", "fast", "TASKDESK_CALL_RATE must be a rate such as 10/second"),
        ("TASKDESK_POLL_THROTTLE", "0/s", "TASKDESK_POLL_THROTTLE must be a rate"),
        ("TASKDESK_CACHE_URL", "memcached://x", "TASKDESK_CACHE_URL must be a redis://"),
        ("TASKDESK_MAX_JSON_DEPTH", "500", "TASKDESK_MAX_JSON_DEPTH must be at most 200"),
        (
            "TASKDESK_STRICT_ROUTING_HEADERS",
            "strict",
            "TASKDESK_STRICT_ROUTING_HEADERS must be a boolean",
        ),
        ("WORKER_NICE", "20", "WORKER_NICE must be at most 19"),
        ("WORKER_NICE", "-5", "WORKER_NICE must be at least 0"),
    ],
)
def test_it_refuses_a_malformed_variable_naming_it(tmp_path, name, value, expected) -> None:  # type: ignore[no-untyped-def]
    result = run_django("pass", {name: value}, tmp_path)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert expected in result.stderr


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "WARNING"),
        ({"LOG_LEVEL": "warning"}, "WARNING"),
        ({"LOG_LEVEL": "DEBUG"}, "DEBUG"),
        ({"LOG_LEVEL": "ERROR"}, "ERROR"),
        ({"BEAT_LOG_LEVEL": "info"}, "INFO"),
    ],
)
def test_beat_logs_the_jobs_it_sends_only_when_asked(tmp_path, env, expected) -> None:  # type: ignore[no-untyped-def]
    code = (
        "from django.conf import settings as s; print(s.LOGGING['loggers']['celery.beat']['level'])"
    )
    result = run_django(code, env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == expected


def test_it_defaults_to_sqlite_and_the_embedded_broker_with_debug_off(tmp_path) -> None:  # type: ignore[no-untyped-def]
    code = (
        "from django.conf import settings as s; "
        "print(s.DEBUG, s.DATABASES['default']['ENGINE'], s.CELERY_BROKER_URL, "
        "s.CELERY_BROKER_TRANSPORT_OPTIONS['polling_interval'], s.ALLOWED_HOSTS, s.TASKDESK_ALLOWED_ORIGINS)"
    )
    result = run_django(code, {}, tmp_path)
    assert result.returncode == 0, result.stderr
    debug, engine, broker, poll, rest = result.stdout.split(" ", 4)
    assert (debug, engine, broker) == ("False", "config.sqlite", "filesystem://")
    assert float(poll) <= 0.1
    assert "['127.0.0.1', 'localhost', '[::1]']" in rest
    assert "'http://127.0.0.1:8000', 'http://localhost:8000', 'http://[::1]:8000'" in rest


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "600 True"),  # the embedded default keeps its SQLite connections too
        ({"DB_CONN_MAX_AGE": "0"}, "0 True"),
        ({"DATABASE_URL": "sqlite:////tmp/x.sqlite3", "DB_CONN_MAX_AGE": "30"}, "30 True"),
        ({"DATABASE_URL": "postgres://u@db:5432/t"}, "600 True"),
    ],
)
def test_each_thread_keeps_its_database_connection_for_db_conn_max_age(  # type: ignore[no-untyped-def]
    tmp_path, env, expected
) -> None:
    code = (
        "from django.conf import settings as s; d = s.DATABASES['default']; "
        "print(d['CONN_MAX_AGE'], d['CONN_HEALTH_CHECKS'])"
    )
    result = run_django(code, env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == expected


@pytest.mark.parametrize(("value", "expected"), [("", "False"), ("1", "True"), ("off", "False")])
def test_strict_routing_headers_is_off_unless_set(tmp_path, value, expected) -> None:  # type: ignore[no-untyped-def]
    code = "from django.conf import settings as s; print(s.TASKDESK_STRICT_ROUTING_HEADERS)"
    result = run_django(code, {"TASKDESK_STRICT_ROUTING_HEADERS": value}, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == expected


def test_a_question_waits_a_day_by_default(tmp_path) -> None:  # type: ignore[no-untyped-def]
    code = "from django.conf import settings as s; print(s.TASKDESK_QUESTION_DEADLINE_SECONDS)"
    assert run_django(code, {}, tmp_path).stdout.strip() == str(24 * 3600)
    set_to = {"TASKDESK_QUESTION_DEADLINE_SECONDS": "600"}
    assert run_django(code, set_to, tmp_path).stdout.strip() == "600"


def test_it_generates_the_secret_key_once_readable_only_by_the_owner(tmp_path) -> None:  # type: ignore[no-untyped-def]
    env = {"SECRET_KEY": ""}
    first = run_django(
        "from django.conf import settings; print(settings.SECRET_KEY)", env, tmp_path
    )
    second = run_django(
        "from django.conf import settings; print(settings.SECRET_KEY)", env, tmp_path
    )
    key_file = tmp_path / "secret_key"
    assert first.stdout == second.stdout
    assert len(first.stdout.strip()) >= 50
    assert key_file.stat().st_mode & 0o777 == 0o600


def test_first_starts_at_once_agree_on_one_whole_secret_key(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import multiprocessing

    from config.settings import _generated_secret

    for attempt in range(10):
        path = tmp_path / f"var-{attempt}" / "secret_key"
        context = multiprocessing.get_context("fork")
        with context.Pool(8) as pool:
            keys = pool.map(_generated_secret, [path] * 8)
        assert len(set(keys)) == 1, keys
        assert len(keys[0]) >= 50
        assert [p.name for p in path.parent.iterdir()] == ["secret_key"]  # no key left behind


def test_it_generates_nothing_when_the_secret_key_is_set(tmp_path) -> None:  # type: ignore[no-untyped-def]
    result = run_django(
        "from django.conf import settings; print(settings.SECRET_KEY_GENERATED, settings.SECRET_KEY)",
        {"SECRET_KEY": "x" * 60},
        tmp_path,
    )
    assert result.stdout.strip() == "False " + "x" * 60
    assert not (tmp_path / "secret_key").exists()


def test_a_generated_secret_key_is_flagged_for_healthz(tmp_path) -> None:  # type: ignore[no-untyped-def]
    result = run_django(
        "from django.conf import settings; print(settings.SECRET_KEY_GENERATED)",
        {"SECRET_KEY": ""},
        tmp_path,
    )
    assert result.stdout.strip() == "True"


def test_the_metrics_folder_is_under_the_var_dir_and_exported(tmp_path) -> None:  # type: ignore[no-untyped-def]
    result = run_django(
        "import os; from django.conf import settings; "
        "print(settings.PROMETHEUS_MULTIPROC_DIR, os.environ['PROMETHEUS_MULTIPROC_DIR'])",
        {},
        tmp_path,
    )
    assert result.stdout.split() == [str(tmp_path / "prometheus")] * 2
    assert (tmp_path / "prometheus").is_dir()


def test_host_and_port_feed_allowed_hosts_and_origins(tmp_path) -> None:  # type: ignore[no-untyped-def]
    code = (
        "from django.conf import settings as s; print(s.ALLOWED_HOSTS, s.TASKDESK_ALLOWED_ORIGINS)"
    )
    result = run_django(code, {"HOST": "taskdesk.internal", "PORT": "9000"}, tmp_path)
    assert "'taskdesk.internal'" in result.stdout
    assert "'http://taskdesk.internal:9000'" in result.stdout


def test_check_deploy_is_clean_under_production_like_settings(tmp_path) -> None:  # type: ignore[no-untyped-def]
    env = {k: v for k, v in os.environ.items() if k not in _INHERITED} | {
        "TASKDESK_VAR_DIR": str(tmp_path),
        **PRODUCTION,
    }
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


@pytest.mark.parametrize(("value", "expected"), [(None, "5"), ("false", "None")])
def test_postgresql_hot_path_statements_are_prepared_unless_turned_off(
    tmp_path, value, expected
) -> None:  # type: ignore[no-untyped-def]
    env = {"DATABASE_URL": "postgres://postgres@127.0.0.1:5432/any"}
    if value is not None:
        env["DB_PREPARED_STATEMENTS"] = value
    code = "from django.conf import settings as s; print(s.DATABASES['default'].get('OPTIONS', {}).get('prepare_threshold'))"
    result = run_django(code, env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == expected


def test_control_jobs_have_their_own_queue_and_every_job_has_time_limits() -> None:
    from config.celery import app
    from tasks_app import runtime, tasks

    routes = app.conf.task_routes
    for job in ("sweep_job", "heartbeat_job", "purge_expired_job", "expire_input_requests_job"):
        assert routes[job] == {"queue": "control"}
    assert "run_task_job" not in routes  # legs stay on the default queue
    assert 0 < app.conf.task_soft_time_limit < app.conf.task_time_limit

    tasks._leg_job_time_limits()  # what the worker does at start

    assert tasks.run_task_job.time_limit == math.ceil(runtime.job_time_limit())
    assert tasks.run_task_job.soft_time_limit == tasks.run_task_job.time_limit - 30
    # Room for a leg of the longest time limit after another one, and the waiting legs.
    assert runtime.job_time_limit() > 2 * 7200


@pytest.mark.parametrize(
    ("env", "backend", "location", "prefix"),
    [
        ({}, "django.core.cache.backends.db.DatabaseCache", "taskdesk_cache", "taskdesk"),
        (
            {"CELERY_BROKER_URL": "redis://127.0.0.1:6379/3"},
            "django.core.cache.backends.redis.RedisCache",
            "redis://127.0.0.1:6379/3",
            "taskdesk",
        ),
        (
            {"CELERY_BROKER_URL": "amqp://guest@localhost//"},
            "django.core.cache.backends.db.DatabaseCache",
            "taskdesk_cache",
            "taskdesk",
        ),
        (
            {"TASKDESK_CACHE_URL": "redis://127.0.0.1:6379/5", "TASKDESK_CACHE_PREFIX": "staging"},
            "django.core.cache.backends.redis.RedisCache",
            "redis://127.0.0.1:6379/5",
            "staging",
        ),
        (
            {"TASKDESK_CACHE_PREFIX": "staging"},
            "django.core.cache.backends.db.DatabaseCache",
            "taskdesk_cache",
            "staging",
        ),
    ],
)
def test_the_shared_cache_is_redis_with_a_redis_broker_and_the_database_otherwise(
    tmp_path, env, backend, location, prefix
) -> None:  # type: ignore[no-untyped-def]
    code = (
        "from django.conf import settings as s; c = s.CACHES['default']; "
        "print(c['BACKEND'], c['LOCATION'], c['KEY_PREFIX'])"
    )
    result = run_django(code, env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [backend, location, prefix]


def test_hsts_covers_subdomains_and_preloads_only_when_asked(tmp_path) -> None:  # type: ignore[no-untyped-def]
    code = "from django.conf import settings as s; print(s.SECURE_HSTS_SECONDS, s.SECURE_HSTS_INCLUDE_SUBDOMAINS, s.SECURE_HSTS_PRELOAD)"
    plain = run_django(code, {"TASKDESK_HSTS_SECONDS": "31536000"}, tmp_path)
    asked = run_django(
        code,
        {
            "TASKDESK_HSTS_SECONDS": "31536000",
            "TASKDESK_HSTS_INCLUDE_SUBDOMAINS": "1",
            "TASKDESK_HSTS_PRELOAD": "1",
        },
        tmp_path,
    )
    assert plain.stdout.split() == ["31536000", "False", "False"], plain.stderr
    assert asked.stdout.split() == ["31536000", "True", "True"], asked.stderr


GENERIC = "-c plan_cache_mode=force_generic_plan"


@pytest.mark.parametrize(
    ("jit", "prepared", "expected"),
    [
        (None, None, f"-c jit=off {GENERIC}"),
        ("false", None, f"-c jit=off {GENERIC}"),
        (None, "false", "-c jit=off"),
        ("true", None, "None"),
    ],
)
def test_postgresql_connections_start_without_jit_and_on_generic_plans_unless_asked(  # type: ignore[no-untyped-def]
    tmp_path, jit, prepared, expected
) -> None:
    env = {"DATABASE_URL": "postgres://postgres@127.0.0.1:5432/any"}
    if jit is not None:
        env["DB_JIT"] = jit
    if prepared is not None:
        env["DB_PREPARED_STATEMENTS"] = prepared
    code = "from django.conf import settings as s; print(s.DATABASES['default']['OPTIONS'].get('options'))"
    result = run_django(code, env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == expected


@pytest.mark.postgres
@pytest.mark.django_db
def test_the_connection_runs_without_jit() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW jit")
        assert cursor.fetchone() == ("off",)
