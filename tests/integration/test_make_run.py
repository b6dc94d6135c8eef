"""`make run`'s supervisor (honcho, the Procfile) does not go on without a process that died:
it says which one and stops the others."""

from __future__ import annotations

import os
import re
import signal
import subprocess

import pytest

from tests.live import BIN, ROOT, LiveStack, stop_process, wait_for

pytestmark = [pytest.mark.live, pytest.mark.slow]


def test_a_worker_that_dies_stops_make_run_with_a_message_naming_it(transactional_db) -> None:
    stack = LiveStack()  # only for its environment: a private folder, port and broker
    stack.collect_static()
    out = stack.tmp / "honcho.log"
    with open(out, "wb") as log:
        honcho = subprocess.Popen(
            [str(BIN / "honcho"), "--no-colour", "-f", "Procfile", "-d", ".", "start"],
            cwd=ROOT,
            env={**stack.env, "PATH": f"{BIN}:{os.environ['PATH']}"},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        started = wait_for(
            "every process to start",
            lambda: (
                text
                if all(
                    f"{n}.1 started" in (text := out.read_text())
                    for n in ("web", "worker", "control", "beat")
                )
                and " ready." in text
                else None
            ),
            timeout=90,
            every=0.3,
            explain=lambda: out.read_text()[-3000:],
        )
        found = re.search(r"worker\.1 started \(pid=(\d+)\)", started)
        assert found is not None, started
        os.kill(int(found.group(1)), signal.SIGKILL)

        honcho.wait(60)
        text = out.read_text()
        assert "worker.1 stopped (rc=-9)" in text
        assert honcho.returncode != 0
        for name in ("web", "control", "beat"):
            assert f"{name}.1 stopped" in text, text[-3000:]
    finally:
        stop_process(honcho)
