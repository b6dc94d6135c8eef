"""`make test`: the suite in two passes that run at the same time.

- **The parallel pass**: every test not marked ``serial``, in ``TEST_WORKERS`` pytest-xdist
  workers (tests/parallel.py).
- **The serial pass**: the fault tests marked ``serial`` (the kill loop, the outages, `make
  run`, the broker outage), one after another in one process. Their deadlines do not allow a
  worker's share of the machine beside three other workers, but they use about a third of a
  core on average and wait for their processes the rest of the time: run after the workers,
  they left the machine mostly idle for four and a half minutes (98 s of CPU in 276 s).

The parallel pass prints as it goes; the serial pass's output is kept and printed when it
ends. The exit status is non-zero when either pass failed (a serial pass that selected no test
has not failed). ``TEST_WORKERS=0`` runs everything in one process, in collection order.
With ``COVERAGE=1`` both passes measure branch coverage (the serial pass into
.coverage.serial), their data is combined, and scripts/coverage_floors.py checks the floors.
``TEST_SERIAL=after`` runs the serial pass after the workers instead. CI's run with coverage
on PostgreSQL splits the two (there the tracer slows the workers, and a lease-timed outage
test lost a lease beside them): ``TEST_SERIAL=none`` runs only the workers and leaves their
coverage data, ``TEST_SERIAL=only`` only the serial pass, adding its data to what is there
before the floors are checked.

Pytest rewrites the asserts of every test module it imports, about 5 s of CPU in each of the
five processes that start at once, unless it may keep the rewritten code as bytecode (in
__pycache__ folders, which git ignores). The run drops PYTHONDONTWRITEBYTECODE, where the
environment sets it, so that only the first run pays. (A PYTHONPYCACHEPREFIX would keep the
folders clean, but Python then ignores the bytecode pip wrote beside the installed packages,
and each process of a first run would compile all of them.)

Environment: TEST_WORKERS (default 4), COVERAGE, PYTEST_ARGS (split as a shell would),
TEST_SERIAL (``beside``, the default, ``after``, ``none`` or ``only``).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
NO_TESTS_COLLECTED = 5  # pytest's exit status when nothing was selected
SERIAL_COVERAGE_FILE = ROOT / ".coverage.serial"
SERIAL_MODES = ("beside", "after", "none", "only")


def pytest(*args: str) -> list[str]:
    return [PYTHON, "-m", "pytest", *args]


def coverage_options(wanted: bool) -> list[str]:
    return ["--cov", "--cov-branch", "--cov-report="] if wanted else []


def main() -> int:
    workers = int(os.environ.get("TEST_WORKERS") or 4)
    coverage = bool(os.environ.get("COVERAGE"))
    extra = shlex.split(os.environ.get("PYTEST_ARGS", ""))
    serial_mode = os.environ.get("TEST_SERIAL") or "beside"
    if serial_mode not in SERIAL_MODES:
        print(f"TEST_SERIAL must be one of {', '.join(SERIAL_MODES)}, not {serial_mode!r}")
        return 2
    keep_bytecode()
    if workers == 0:
        status = subprocess.call(pytest(*coverage_options(coverage), *extra), cwd=ROOT)
        return status or check_floors(coverage)

    # In collection order (pytest-django's: the tests inside a rolled-back transaction before
    # those that flush the database), not pytest-xdist's largest group first, which ran the
    # browser modules' flushes before tests that read what the migrations wrote.
    parallel = pytest("-n", str(workers), "--dist", "loadgroup", "--no-loadscope-reorder",
                      *coverage_options(coverage), *extra)  # fmt: skip
    serial = pytest("--only-serial", *coverage_options(coverage), *extra)
    serial_env = {**os.environ}
    if coverage:
        serial_env["COVERAGE_FILE"] = str(SERIAL_COVERAGE_FILE)
    SERIAL_COVERAGE_FILE.unlink(missing_ok=True)
    parallel_status = serial_status = 0
    if serial_mode == "beside":
        parallel_status, serial_status = side_by_side(parallel, serial, serial_env)
    else:
        if serial_mode in ("after", "none"):
            parallel_status = subprocess.call(parallel, cwd=ROOT)
        if serial_mode in ("after", "only"):
            serial_status = subprocess.call(serial, cwd=ROOT, env=serial_env)
    if serial_status == NO_TESTS_COLLECTED:
        serial_status = 0
    failed = [name for name, status in (("parallel", parallel_status), ("serial", serial_status))
              if status != 0]  # fmt: skip
    if failed:
        print(f"\n=== make test failed: the {' and the '.join(failed)} pass", flush=True)
        return 1
    if serial_mode == "none":
        if coverage:
            print("\n=== coverage: the workers' data is in .coverage; the floors are checked "
                  "after the serial pass (TEST_SERIAL=only)", flush=True)  # fmt: skip
        return 0
    if coverage and SERIAL_COVERAGE_FILE.exists():
        subprocess.run([PYTHON, "-m", "coverage", "combine", "--append",
                        str(SERIAL_COVERAGE_FILE)], cwd=ROOT, check=True)  # fmt: skip
    return check_floors(coverage)


def keep_bytecode() -> None:
    """Let this run's processes keep their bytecode (the module's docstring says why)."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


def side_by_side(
    parallel: list[str], serial: list[str], serial_env: dict[str, str]
) -> tuple[int, int]:
    """Run SERIAL in the background, its output kept, while PARALLEL prints; then print
    SERIAL's output. Return both exit statuses."""
    with tempfile.TemporaryFile("w+") as serial_log:
        running = subprocess.Popen(serial, cwd=ROOT, env=serial_env, stdout=serial_log,
                                   stderr=subprocess.STDOUT)  # fmt: skip
        try:
            parallel_status = subprocess.call(parallel, cwd=ROOT)
            if running.poll() is None:
                print("\n=== waiting for the serial pass (tests marked serial)", flush=True)
            serial_status = running.wait()
        finally:
            if running.poll() is None:
                running.terminate()
                running.wait()
        serial_log.seek(0)
        print("\n=== the serial pass (tests marked serial), run beside the workers", flush=True)
        sys.stdout.write(serial_log.read())
    return parallel_status, serial_status


def check_floors(coverage: bool) -> int:
    if not coverage:
        return 0
    return subprocess.call([PYTHON, "scripts/coverage_floors.py"], cwd=ROOT)


if __name__ == "__main__":
    sys.exit(main())
