"""Shared fixtures and personas.

Personas (each says what it may do):
- ``alice``: an MCP client in tenant ``acme``; owns tasks and answers their questions.
- ``bob``: an MCP client in tenant ``globex``; must never see alice's tasks.
- ``operator``: a Django user in tenant ``acme`` with the operator role; answers inbox
  questions of acme's tasks, cancels them and reconciles their effects.
- ``viewer``: a Django user in tenant ``acme`` with the viewer role; sees acme's tasks and
  questions, changes nothing.
- ``outsider``: a Django user in no tenant; sees nothing.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# Keep test runs' broker folder, SQLite files and exports apart from a `make run` on the same
# checkout. Set before Django reads its settings.
os.environ.setdefault(
    "TASKDESK_VAR_DIR", str(Path(__file__).resolve().parent.parent / "var" / "test")
)

import pytest

from tests import services


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    services.apply_markers(items)


@pytest.fixture(autouse=True)
def _required_services(request: pytest.FixtureRequest) -> None:
    missing = request.node.stash.get(services.MISSING_SERVICE, None)
    if missing:
        pytest.fail(
            f"TASKDESK_REQUIRE_SERVICES is set but a required service is missing: {missing}"
        )


@pytest.fixture(autouse=True)
def _only_its_own_stack(request: pytest.FixtureRequest) -> None:
    """A test that takes no kept stack runs without one: the kept stack's processes share this
    process's broker and database, and would take the test's jobs or sweep its rows."""
    from tests.live import close_kept_stack
    from tests.parallel import KEPT_STACK_FIXTURES

    if not KEPT_STACK_FIXTURES & set(request.fixturenames):
        close_kept_stack()


@pytest.fixture(autouse=True)
def _test_settings(settings):  # type: ignore[no-untyped-def]
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.STORAGES = {
        "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }
    settings.TASKDESK_TOOLSETS = ["demo", "conformance"]
    # /metrics reads the database at each scrape (tests/tasks_app/test_metrics.py turns the
    # shared copy on where it is what is tested).
    settings.TASKDESK_METRICS_DATABASE_SECONDS = 0
    # A leg run in the test process does not stand by for more work afterwards (the tests of
    # standing by turn it on); the worker processes of live tests do, as shipped.
    settings.TASKDESK_DRAIN_STANDBY = False
    # A cache namespace of its own for each test: rate-limit counts never carry over (the
    # shared cache may be a Redis server that outlives the test).
    settings.CACHES = {
        name: {**config, "KEY_PREFIX": f"test-{uuid.uuid4().hex}"}
        for name, config in settings.CACHES.items()
    }


@pytest.fixture
def acme(db):  # type: ignore[no-untyped-def]
    from tasks_app.models import Tenant

    return Tenant.objects.create(slug="acme")


@pytest.fixture
def alice(db):  # type: ignore[no-untyped-def]
    from tasks_app.clients import client_get_or_create

    return client_get_or_create(name="alice", tenant="acme")


@pytest.fixture
def alice_token(alice):  # type: ignore[no-untyped-def]
    from tasks_app import tokens

    return tokens.issue(alice)


@pytest.fixture
def bob(db):  # type: ignore[no-untyped-def]
    from tasks_app.clients import client_get_or_create

    return client_get_or_create(name="bob", tenant="globex")


@pytest.fixture
def bob_token(bob):  # type: ignore[no-untyped-def]
    from tasks_app import tokens

    return tokens.issue(bob)


@pytest.fixture
def operator(alice, django_user_model):  # type: ignore[no-untyped-def]
    from tasks_app.operators import grant_role

    user = django_user_model.objects.create_user(username="olga", password="pw-olga-123")
    alice.tenant.members.add(user)
    grant_role(user, "operator")
    return user


@pytest.fixture
def viewer(alice, django_user_model):  # type: ignore[no-untyped-def]
    from tasks_app.operators import grant_role

    user = django_user_model.objects.create_user(username="vera", password="pw-vera-123")
    alice.tenant.members.add(user)
    grant_role(user, "viewer")
    return user


@pytest.fixture
def outsider(db, django_user_model):  # type: ignore[no-untyped-def]
    return django_user_model.objects.create_user(username="oscar", password="pw-oscar-123")


@pytest.fixture(scope="session", autouse=True)
def _empty_embedded_broker():  # type: ignore[no-untyped-def]
    """Start each run with an empty embedded queue (messages of an earlier run name gone tasks)."""
    from django.conf import settings

    if settings.CELERY_BROKER_URL.startswith("filesystem"):
        folder = Path(settings.CELERY_BROKER_TRANSPORT_OPTIONS["data_folder_in"])
        for message in folder.glob("*"):
            message.unlink(missing_ok=True)
    elif settings.CELERY_BROKER_URL.startswith(("amqp", "pyamqp")):
        # A RabbitMQ vhost keeps its queues between runs.
        from config.celery import app

        app.control.purge()


FLUSH_ATTEMPTS = 5


@pytest.fixture(scope="session", autouse=True)
def _flush_outlasts_a_deadlock() -> Iterator[None]:
    """On PostgreSQL, the flush after a test that wrote through its transaction (one TRUNCATE of
    every table) can lose a deadlock to a session that locks rows of several tables, such as a
    kept live stack's sweeper: PostgreSQL then cancels the TRUNCATE, and the next test found
    the rows of the last one (a duplicate username, in CI). The flush is tried again instead,
    up to FLUSH_ATTEMPTS times."""
    from django.db import OperationalError, connection

    if connection.vendor != "postgresql":
        yield
        return
    from psycopg.errors import DeadlockDetected

    operations = type(connection.ops)
    flush = operations.execute_sql_flush

    def execute_sql_flush(self: Any, sql_list: list[str]) -> None:
        for attempt in range(1, FLUSH_ATTEMPTS + 1):
            try:
                flush(self, sql_list)
                return
            except OperationalError as exc:
                if not isinstance(exc.__cause__, DeadlockDetected) or attempt == FLUSH_ATTEMPTS:
                    raise
                time.sleep(0.1 * attempt)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(operations, "execute_sql_flush", execute_sql_flush)
        yield


@pytest.fixture
def live(transactional_db):  # type: ignore[no-untyped-def]
    """A running stack (web, worker, beat) on the test database, kept for the next test that
    wants one (``tests.live.kept_stack``)."""
    from tests.live import kept_stack

    with kept_stack() as stack:
        yield stack


@pytest.fixture(scope="session", autouse=True)
def _dispatch_publisher_rests(django_db_setup):  # type: ignore[no-untyped-def]
    """Before the test database is dropped, stop the kept live stack and let this process's
    dispatch publisher thread finish and close its connection (it holds one for a second
    after its last record)."""
    yield
    from tasks_app import dispatch
    from tests.live import close_kept_stack

    close_kept_stack()  # its processes hold connections to the test database
    dispatch.wait_for_publisher(idle=True)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The live stacks' files go with a session that passed; after a failure they stay, and
    the summary says where."""
    from tests.live import end_run

    kept = end_run(passed=exitstatus == 0)
    if kept is not None:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_line(f"the live stacks' files and logs are kept in {kept}")
