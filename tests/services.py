"""Which external services a test needs, and what happens when one is missing.

A test marked ``postgres``, ``redis``, ``rabbitmq`` or ``browser`` is skipped with a visible reason when the
service cannot be reached. CI sets ``TASKDESK_REQUIRE_SERVICES=1``, which turns that skip into
a failure, so a CI run never passes by skipping.
"""

from __future__ import annotations

import os
import shutil
import socket
from functools import cache
from urllib.parse import urlsplit

import pytest

from tests.parallel import redis_url_of_this_worker

MISSING_SERVICE = pytest.StashKey[str]()
CHROMIUM_PATHS = ("/usr/bin/chromium", "/usr/bin/chromium-browser")


def required() -> bool:
    return os.environ.get("TASKDESK_REQUIRE_SERVICES", "") in {"1", "true", "yes"}


def port_open(host: str, port: int, timeout: float = 1) -> bool:
    """Whether something accepts TCP connections on HOST:PORT."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


REDIS_DEFAULT = "redis://127.0.0.1:6379/0"


@cache
def redis_url() -> str | None:
    """A Redis URL for tests: the broker's if it is Redis, else the local default if reachable."""
    broker = os.environ.get("CELERY_BROKER_URL", "")
    # The broker's URL is already this xdist worker's (tests/parallel.py); the default is moved.
    url = broker if broker.startswith("redis") else redis_url_of_this_worker(REDIS_DEFAULT)
    parts = urlsplit(url)
    return url if port_open(parts.hostname or "127.0.0.1", parts.port or 6379) else None


# A RabbitMQ vhost for the tests that need one whatever the run's broker (the multi-node
# test). Give each checkout or CI run a vhost of its own.
AMQP_DEFAULT = "amqp://guest:guest@127.0.0.1:5672//"


@cache
def amqp_url() -> str | None:
    """A RabbitMQ URL for tests: the broker's if it is RabbitMQ, else TASKDESK_TEST_AMQP_URL
    (default: the local server's default vhost), if reachable."""
    broker = os.environ.get("CELERY_BROKER_URL", "")
    if broker.startswith(("amqp", "pyamqp")):
        url = broker
    else:
        url = os.environ.get("TASKDESK_TEST_AMQP_URL") or AMQP_DEFAULT
    parts = urlsplit(url)
    return url if port_open(parts.hostname or "127.0.0.1", parts.port or 5672) else None


def redis_server_binary() -> str | None:
    return shutil.which("redis-server")


# Chromium for the browser tests (Playwright). Every page of a test comes from one site (the
# stack's 127.0.0.1), so site isolation's process per site only costs CPU: without it a page
# cost 8 % less CPU on two cores.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-site-isolation-trials",
    "--disable-features=site-per-process,IsolateOrigins",
]


def chromium_path() -> str | None:
    for path in CHROMIUM_PATHS:
        if os.path.exists(path):
            return path
    return None


@cache
def postgres_problem() -> str | None:
    from django.conf import settings

    if settings.DATABASES["default"]["ENGINE"] != "config.postgresql":
        return "this run uses SQLite (set DATABASE_URL=postgres://... to run it)"
    return None


def _missing(marker: str) -> str | None:
    if marker == "postgres":
        return postgres_problem()
    if marker == "redis":
        if redis_url() is None:
            return "no Redis server reachable on 127.0.0.1:6379"
        if redis_server_binary() is None:
            return "redis-server is not installed"
        return None
    if marker == "rabbitmq":
        if amqp_url() is None:
            return "no RabbitMQ server reachable (TASKDESK_TEST_AMQP_URL)"
        return None
    if marker == "browser":
        if chromium_path() is None:
            return "Chromium is not installed (apt-get install chromium)"
        return None
    return None


def apply_markers(items: list[pytest.Item]) -> None:
    for item in items:
        for marker in ("postgres", "redis", "rabbitmq", "browser"):
            if item.get_closest_marker(marker) is None:
                continue
            reason = _missing(marker)
            if reason is None:
                continue
            # Running on SQLite is a choice of the run, not a missing service.
            if required() and not (
                marker == "postgres" and reason.startswith("this run uses SQLite")
            ):
                # Read by the autouse fixture `_required_services`, which fails the test.
                item.stash[MISSING_SERVICE] = f"{marker}: {reason}"
            else:
                item.add_marker(pytest.mark.skip(reason=f"needs {marker}: {reason}"))
