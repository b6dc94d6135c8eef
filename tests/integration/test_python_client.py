"""taskdesk-client (clients/python) against a live server, through a proxy that loses answers.

Each case ends with exactly one task per submission: a dropped acknowledgement, a burst of
503s, and a submitting process killed after it sent its call, whose submission ``taskdesk
resume`` settles from a new process. The command-line cases run the ``taskdesk`` command of a
fresh virtual environment that has the client package and no Django.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from taskdesk_client import Backoff, Client, Journal

from tasks_app.models import Task
from tests.live import ROOT, FaultProxy, stop_process, wait_for

pytestmark = pytest.mark.live

EXPORT = {"quarter": "Q3", "format": "csv", "rows": 50}
CALL = ["call", "export_report", "--arg", "quarter=Q3", "--arg", "format=csv", "--arg", "rows=50"]


def journaled_keys(path: Path) -> set[str]:
    """The keys in the journal at PATH, read by a connection of its own."""
    if not path.exists():
        return set()
    with sqlite3.connect(path) as db:
        return {row[0] for row in db.execute("SELECT key FROM submissions")}


def test_a_dropped_acknowledgement_is_retried_with_the_same_key(live, alice_token, tmp_path):
    journal = tmp_path / "journal.sqlite3"
    with FaultProxy(live.mcp_url) as proxy:
        proxy.script("tools/call", ["drop"])
        # What the journal holds when each call reaches the proxy: the key is written first.
        seen_in_journal: list[bool] = []
        proxy.on_request = lambda method, headers: seen_in_journal.append(
            headers.get("Idempotency-Key") in journaled_keys(journal)
        )
        with Client(
            proxy.url, token=alice_token, journal=journal, backoff=Backoff(base=0.1)
        ) as client:
            handle = client.submit("export_report", EXPORT)
            calls = proxy.requests("tools/call")
            assert [action for _, action in calls] == ["drop", "pass"]
            assert {headers["Idempotency-Key"] for headers, _ in calls} == {handle.key}
            assert seen_in_journal[:2] == [True, True]
            assert handle.replayed  # the second answer is the receipt of the first call

            task = Task.objects.get()
            assert handle.task_id == task.pk
            assert Journal(journal).get(proxy.url, handle.key).task_id == task.pk  # type: ignore[union-attr]

            result = handle.result(timeout=60)
            assert result["isError"] is False
            assert Task.objects.count() == 1


def test_a_503_burst_is_waited_out_and_makes_one_task(live, alice_token, tmp_path):
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        time.sleep(seconds)

    with FaultProxy(live.mcp_url, retry_after=1) as proxy:
        # The server accepts the first call, but the answer the client gets is a 503; two more
        # 503s follow from the proxy itself.
        proxy.script("tools/call", ["forward-503", "503", "503"])
        with Client(
            proxy.url, token=alice_token, journal=tmp_path / "j.sqlite3", sleep=sleep
        ) as client:
            handle = client.submit("export_report", EXPORT)
    assert [action for _, action in proxy.requests("tools/call")] == [
        "forward-503",
        "503",
        "503",
        "pass",
    ]
    assert len(slept) == 3 and all(1 <= pause <= 2.5 for pause in slept), slept  # Retry-After: 1
    assert handle.replayed and handle.task_id == Task.objects.get().pk


def test_unreachable_leaves_the_submission_to_resume(live, alice_token, tmp_path):
    journal = tmp_path / "j.sqlite3"
    with FaultProxy(live.mcp_url) as proxy:
        proxy.script("tools/call", ["503"] * 3)
        with Client(
            proxy.url,
            token=alice_token,
            journal=journal,
            backoff=Backoff(attempts=3, base=0.05),
            sleep=lambda _: None,
        ) as client:
            from taskdesk_client import Unreachable

            with pytest.raises(Unreachable, match="after 3 attempts"):
                client.submit("export_report", EXPORT, key="report-q3")
            assert Task.objects.count() == 0
            [pending] = client.journal.unsettled(proxy.url)
            assert pending.key == "report-q3" and pending.arguments == EXPORT

            [outcome] = client.resume()
            assert outcome.key == "report-q3" and outcome.task_id == Task.objects.get().pk
            assert client.journal.unsettled(proxy.url) == []
            assert client.resume() == []


def test_a_refused_call_is_settled_with_its_error(live, alice_token, tmp_path):
    from taskdesk_client import KeyReused, Refused

    with Client(live.mcp_url, token=alice_token, journal=tmp_path / "j.sqlite3") as client:
        with pytest.raises(Refused) as refused:
            client.submit("export_report", {"quarter": "Q9"}, key="bad")
        assert refused.value.code == -32602 and refused.value.status == 400
        assert client.journal.unsettled(client.url) == []  # resume does not resend it
        with pytest.raises(KeyReused, match="'bad' is already journaled"):
            client.submit("export_report", EXPORT, key="bad")
    assert Task.objects.count() == 0


def test_a_handle_answers_cancels_and_reads_results(live, alice_token, tmp_path):
    from taskdesk_client import TaskCancelled

    with Client(live.mcp_url, token=alice_token, journal=tmp_path / "j.sqlite3") as client:
        asking = client.submit("confirm_action", {"action": "deploy"})
        task = asking.wait(timeout=60, until_input=True)
        [(key, request)] = asking.input_requests.items()
        assert task["status"] == "input_required"
        assert request["params"]["message"] == "Confirm: deploy"
        asking.answer(key, {"confirm": True})
        result = asking.call_tool_result(timeout=60)  # the official SDK's type
        assert result.content[0].text == "Confirmed: deploy" and not result.is_error  # type: ignore[union-attr]

        slow = client.submit("slow_echo", {"text": "hi", "seconds": 60})
        slow.cancel()
        with pytest.raises(TaskCancelled):
            slow.result(timeout=30)
        assert slow.status == "cancelled"

        # A task known only by its id (a receipt kept elsewhere).
        assert client.task(asking.task_id).status == "completed"  # type: ignore[arg-type]


# -- the command line, from a fresh virtual environment without Django ----------------------


@pytest.fixture(scope="module")
def client_command(tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    """``./clients/python`` installed into a new virtual environment: its ``taskdesk-client``.
    The environment gets no pip of its own: this environment's uv (``make install`` put it
    there) installs into it (pip took 30 s of this module's set-up in a busy suite)."""
    venv = tmp_path_factory.mktemp("client-venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    uv = Path(sys.executable).parent / "uv"
    subprocess.run(
        [str(uv), "pip", "install", "--quiet", "--python", str(python), "-c",
         str(ROOT / "constraints.txt"), str(ROOT / "clients" / "python")],
        check=True,
    )  # fmt: skip
    no_django = subprocess.run([str(python), "-c", "import django"], capture_output=True)
    assert no_django.returncode != 0, "the client's environment must not have Django"
    return venv / "bin" / "taskdesk-client"


@pytest.mark.slow
def test_a_killed_submitter_is_settled_by_resume_in_a_new_process(
    live, alice_token, tmp_path, client_command
):
    journal = tmp_path / "journal.sqlite3"
    with FaultProxy(live.mcp_url) as proxy:
        env = {
            **os.environ,
            "TASKDESK_URL": proxy.url,
            "TASKDESK_TOKEN": alice_token,
            "TASKDESK_JOURNAL": str(journal),
        }
        proxy.script("tools/call", ["hold"])  # the server accepts; the answer never comes
        submitter = subprocess.Popen(
            [str(client_command), *CALL, "--key", "report-q3-cli"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            task = wait_for("the call to be accepted", Task.objects.first, timeout=60, every=0.1)
            assert submitter.poll() is None  # still waiting for its acknowledgement
            os.killpg(submitter.pid, signal.SIGKILL)
            submitter.wait(10)
        finally:
            stop_process(submitter)
        assert submitter.stdout is not None and submitter.stdout.read() == b""  # no receipt seen

        resumed = subprocess.run(
            [str(client_command), "resume"], env=env, capture_output=True, text=True, timeout=120
        )
        assert resumed.returncode == 0, resumed.stderr
        assert resumed.stdout.splitlines() == [f"report-q3-cli {task.pk}"]
        assert Task.objects.count() == 1

        # The journal now holds the receipt: nothing is left to resume, and `call` with the
        # same key answers from it and waits for the result.
        again = subprocess.run(
            [str(client_command), "resume"], env=env, capture_output=True, text=True, timeout=60
        )
        assert (again.returncode, again.stdout) == (0, "")
        waited = subprocess.run(
            [str(client_command), *CALL, "--key", "report-q3-cli", "--wait"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert waited.returncode == 0, waited.stderr
        task_line, result_line = waited.stdout.splitlines()
        assert task_line == task.pk and '"isError": false' in result_line
        assert Task.objects.count() == 1
