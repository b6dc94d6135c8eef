"""tests/parallel.py's split of the suite: the serial pass (``--only-serial``) collects only
the modules that say ``mark.serial``, and in the workers a test marked serial from any other
module fails with the reason, so no test is left out of both passes unseen."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.parallel import ROOT

VISIBLE = "import pytest\npytestmark = pytest.mark.serial\n\ndef test_fault():\n    pass\n"
HIDDEN = "import pytest\nm = pytest.mark\npytestmark = m.serial\n\ndef test_hidden():\n    pass\n"
PLAIN = "def test_plain():\n    pass\n"


@pytest.fixture
def modules(tmp_path: Path) -> Path:
    """A folder with a module marked serial as the serial pass sees it, one marked serial out
    of its sight, and a plain one."""
    for name, text in (("test_visible", VISIBLE), ("test_hidden", HIDDEN), ("test_plain", PLAIN)):
        (tmp_path / f"{name}.py").write_text(text)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    serial: one process\n")
    return tmp_path


def _pytest(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.parallel", "-p", "no:cacheprovider",
         "-c", str(folder / "pytest.ini"), "--rootdir", str(folder), "-q", *args, str(folder)],
        cwd=ROOT, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT),
                       "TASKDESK_VAR_DIR": str(folder / "var")},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_the_serial_pass_collects_only_modules_that_say_serial(modules: Path) -> None:
    collected = _pytest(modules, "--only-serial", "--collect-only")

    assert collected.returncode == 0, collected.stdout + collected.stderr
    assert "test_visible.py::test_fault" in collected.stdout
    assert "test_hidden" not in collected.stdout and "test_plain" not in collected.stdout


def test_the_workers_fail_a_serial_test_the_serial_pass_would_not_see(modules: Path) -> None:
    run = _pytest(modules, "-n", "1", "-rA")

    assert run.returncode == 1, run.stdout + run.stderr
    assert "1 passed, 1 error" in run.stdout
    assert re.search(r"^PASSED \S*test_plain\.py::test_plain$", run.stdout, re.MULTILINE)
    assert "test_fault" not in run.stdout  # left to the serial pass
    assert "test_hidden.py marks this test serial, but the module's text does not say" in run.stdout
