"""Running the suite in several pytest-xdist workers at once (`make test` does; `-n 0` does not).

Loaded with ``-p tests.parallel`` (pyproject.toml), before pytest-django reads Django's
settings, so that each worker gets a place of its own before anything is opened:

- ``TASKDESK_VAR_DIR`` gains the worker's name: its SQLite files, embedded broker folder,
  exports, mail and metrics folders are its own (the live stacks it starts point at them),
  and so does ``PROMETHEUS_MULTIPROC_DIR``.
- a Redis broker or cache URL moves to a database of its own (the run's number plus one plus
  the worker's index), so one worker's Celery workers never take another's jobs and the
  held-work leases of one worker's stacks are not another's. PostgreSQL test databases are
  already per worker (pytest-django adds the worker's name).

And it groups what the workers are handed (``--dist loadgroup``), in the order of collection:

- the tests of a module that share a module-scoped fixture (a stack, a browser, a result
  that costs half a minute) or a kept stack (``tests.live.kept_stack``) on one worker, so it
  is made once;
- every test of RabbitMQ on one worker (they share a vhost);
- none marked ``serial`` (the kill loop, the outages, `make run`, the broker outage: fault
  tests whose deadlines assume a core is free when their processes need one): `make test`
  runs those beside the workers in one process of their own, with ``--only-serial``
  (scripts/run_tests.py). That process collects only the test modules whose text says
  ``mark.serial`` (collecting the whole suite for a handful of tests took it 7-8 s of CPU on
  a new clone), and in the workers a test marked serial from any other module fails, so
  none is left out of both passes unseen.

Nothing makes a worker wait for another: a worker that waited for a turn held its share of
the run idle (measured: a queue of fault tests left two of three workers waiting 200 s).
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

ROOT = Path(__file__).resolve().parent.parent
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")


def worker_index() -> int:
    """This worker's number (gw3 is 3), or -1 outside a worker."""
    return int(WORKER.removeprefix("gw")) if WORKER else -1


def redis_url_of_this_worker(url: str) -> str:
    """URL, a redis:// URL, moved to the database of this worker (unchanged outside one)."""
    if not WORKER:
        return url
    parts = urlsplit(url)
    database = int(parts.path.strip("/") or 0) + 1 + worker_index()
    return urlunsplit(parts._replace(path=f"/{database}"))


def _isolate() -> None:
    if not WORKER:
        return
    base = os.environ.get("TASKDESK_VAR_DIR") or str(ROOT / "var" / "test")
    var = Path(base) / WORKER
    os.environ["TASKDESK_VAR_DIR"] = str(var)
    # The controller's settings set this for the whole run (config/settings.py) before the
    # workers started with its environment.
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(var / "prometheus")
    for name in ("CELERY_BROKER_URL", "TASKDESK_CACHE_URL"):
        url = os.environ.get(name, "")
        if url.startswith("redis"):
            os.environ[name] = redis_url_of_this_worker(url)


_isolate()


# The fixtures that take a kept stack (``tests.live.kept_stack``). Any other test closes it
# first (tests/conftest.py): its processes share this process's broker and database, and
# would take the other test's jobs or sweep its rows.
KEPT_STACK_FIXTURES = frozenset({"live", "stack"})


def _shares_a_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    if KEPT_STACK_FIXTURES & set(info.names_closure):
        return True  # one after another on one worker, they share the stack
    return any(definitions[-1].scope == "module" for definitions in info.name2fixturedefs.values())


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--only-serial",
        action="store_true",
        help="run only the tests marked serial (make test's pass beside the workers)",
    )


def _says_serial(path: Path) -> bool:
    """Whether the text of test module PATH marks tests serial (the module docstring says
    why the serial pass looks no further)."""
    return b"mark.serial" in path.read_bytes()


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if (
        config.getoption("only_serial")
        and collection_path.name.startswith("test_")
        and collection_path.suffix == ".py"
        and not _says_serial(collection_path)
    ):
        return True
    return None  # pytest's own rules decide


_UNSEEN_SERIAL = pytest.StashKey[bool]()


def _mark_unseen_serial(items: list[pytest.Item]) -> None:
    """Keep in this pass, to fail at their setup, the tests marked serial whose module the
    serial pass would not collect (a worker that refused its whole collection would only be
    seen as an internal error of pytest-xdist's, without the reason)."""
    for item in items:
        if item.get_closest_marker("serial") is not None and not _says_serial(item.path):
            item.stash[_UNSEEN_SERIAL] = True


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.stash.get(_UNSEEN_SERIAL, False):
        pytest.fail(
            f"{item.nodeid.split('::')[0]} marks this test serial, but the module's text does "
            "not say mark.serial, so make test's serial pass would not collect it: mark it "
            "with pytest.mark.serial in the module",
            pytrace=False,
        )


def _deselect(config: pytest.Config, items: list[pytest.Item], serial: bool) -> None:
    """Keep the tests whose `serial` mark is SERIAL (and those that fail for an unseen one);
    report the others as deselected."""
    kept: list[pytest.Item] = []
    left: list[pytest.Item] = []
    for item in items:
        marked = item.get_closest_marker("serial") is not None
        keep = marked == serial or item.stash.get(_UNSEEN_SERIAL, False)
        (kept if keep else left).append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept


# First: pytest-xdist's own hook, which reads the groups to name them in the test ids, was
# registered after this module and would otherwise run before the groups are given.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("only_serial"):
        _deselect(config, items, serial=True)
        return
    # A worker collects what it runs (xdist sets its own `dist` to "no"); the controller only
    # with --collect-only.
    if not WORKER and config.getoption("dist", "no") == "no":
        return
    # The order stays the collection's: spreading the tests that start processes over the run
    # put them before tests that read what the migrations wrote, which their flushes delete.
    _mark_unseen_serial(items)
    _deselect(config, items, serial=False)  # left to the second pass
    for item in items:
        if item.get_closest_marker("rabbitmq") is not None:
            item.add_marker(pytest.mark.xdist_group("rabbitmq"))
        elif _shares_a_module_fixture(item):
            # A stack, a browser or a costly result made once per module, not once per worker.
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """On a worker, check that the groups above reached pytest-xdist: a grouped test's id
    carries its group's name after ``@`` when they did. Without them every worker starts its
    own stack and browser for each module it is handed (a pytest 9.2 with pytest-xdist 3.8
    renamed nothing, and the whole suite ran with no group at all)."""
    if not WORKER or not session.config.getvalue("loadgroup"):
        return
    ungrouped = [
        item.nodeid
        for item in session.items
        if item.get_closest_marker("xdist_group") is not None and "@" not in item.nodeid
    ]
    if ungrouped:
        raise pytest.UsageError(
            f"{len(ungrouped)} tests lost their xdist group (first: {ungrouped[0]}): this "
            "pytest-xdist cannot name groups in this pytest's node ids"
        )
