"""taskdesk-client's parts that need no server: the journal, argument parsing, backoff."""

from __future__ import annotations

import email.utils
import multiprocessing
import time
from pathlib import Path

import pytest
from taskdesk_client import Backoff, Journal, KeyReused
from taskdesk_client.cli import main, parse_arguments
from taskdesk_client.client import retry_after_seconds
from taskdesk_client.journal import default_path

URL = "http://127.0.0.1:9/mcp"


def test_the_journal_keeps_a_submission_until_it_is_settled(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "deep" / "journal.sqlite3")
    entry = journal.record(key="k1", url=URL, tool="export_report", arguments={"rows": 5})
    assert not entry.settled and entry.task_id is None
    # Another process opening the same file sees it straight away.
    assert [e.key for e in Journal(journal.path).unsettled(URL)] == ["k1"]
    assert journal.unsettled("http://elsewhere/mcp") == []

    # The same call again is the same entry; another call under the key is refused.
    assert journal.record(key="k1", url=URL, tool="export_report", arguments={"rows": 5}) == entry
    with pytest.raises(KeyReused, match="'k1' is already journaled"):
        journal.record(key="k1", url=URL, tool="export_report", arguments={"rows": 6})

    journal.settle(key="k1", url=URL, receipt={"resultType": "task", "taskId": "t-1"})
    settled = journal.get(URL, "k1")
    assert settled is not None and settled.task_id == "t-1" and settled.settled
    assert journal.unsettled(URL) == []


def _record(path: str, index: int) -> None:
    Journal(path).record(key=f"k{index}", url=URL, tool="t", arguments={"i": index})


def test_several_processes_share_one_journal(tmp_path: Path) -> None:
    path = str(tmp_path / "journal.sqlite3")
    Journal(path)
    procs = [multiprocessing.Process(target=_record, args=(path, i)) for i in range(4)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(30)
        assert proc.exitcode == 0
    assert sorted(e.key for e in Journal(path).unsettled(URL)) == ["k0", "k1", "k2", "k3"]


@pytest.mark.parametrize("given", ["~/taskdesk.sqlite3", Path("~/taskdesk.sqlite3")])
def test_a_journal_path_under_the_home_directory_is_expanded(  # type: ignore[no-untyped-def]
    monkeypatch, tmp_path, given
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)

    journal = Journal(given)
    journal.record(key="k1", url=URL, tool="t", arguments={})

    assert journal.path == home / "taskdesk.sqlite3"
    assert journal.path.is_file()
    assert not (tmp_path / "~").exists()  # no folder named "~" in the working directory


def test_the_default_journal_is_in_the_user_data_directory(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert default_path() == tmp_path / "taskdesk" / "journal.sqlite3"


def test_arguments_are_json_when_they_parse_and_strings_otherwise() -> None:
    assert parse_arguments(["rows=500", "quarter=Q3", "ok=true", "ids=[1, 2]", 'n="123"']) == {
        "rows": 500,
        "quarter": "Q3",
        "ok": True,
        "ids": [1, 2],
        "n": "123",
    }
    assert parse_arguments(["note=a=b"]) == {"note": "a=b"}
    with pytest.raises(ValueError, match="write it as name=value"):
        parse_arguments(["rows"])


def test_retry_after_reads_seconds_and_dates() -> None:
    assert retry_after_seconds("3") == 3.0
    assert retry_after_seconds(None) is None and retry_after_seconds("soon") is None
    now = time.time()
    later = email.utils.formatdate(now + 10, usegmt=True)
    assert 8 <= (retry_after_seconds(later, now=now) or 0) <= 10


def test_backoff_grows_with_jitter_and_never_undercuts_retry_after() -> None:
    backoff = Backoff(base=1.0, max_delay=4.0)
    for attempt, ceiling in [(1, 1.0), (2, 2.0), (3, 4.0), (6, 4.0)]:
        delays = [backoff.delay(attempt) for _ in range(200)]
        assert all(0 <= d <= ceiling for d in delays)
        assert max(delays) - min(delays) > ceiling / 4  # jittered, not fixed
    assert all(backoff.delay(1, retry_after=7) >= 7 for _ in range(50))


def test_the_command_line_says_what_it_needs(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("TASKDESK_URL", raising=False)
    assert main(["resume"]) == 2
    assert "--url or TASKDESK_URL" in capsys.readouterr().err


def test_a_bad_argument_is_refused_before_anything_is_journaled(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    journal = tmp_path / "journal.sqlite3"
    assert main(["call", "t", "--arg", "oops", "--url", URL, "--journal", str(journal)]) == 2
    assert "write it as name=value" in capsys.readouterr().err
    assert Journal(journal).entries() == []


def _offline_client(tmp_path: Path, answer: dict, **options):  # type: ignore[no-untyped-def]
    """A Client whose server answers every request with ANSWER; the requests it sent."""
    import json

    import httpx
    from taskdesk_client import Client

    sent: list[dict] = []

    def server(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(200, json={"jsonrpc": "2.0", "id": sent[-1]["id"], "result": answer})

    http = httpx.Client(transport=httpx.MockTransport(server))
    client = Client(URL, token="t", journal=tmp_path / "j.sqlite3", http=http, **options)
    return client, sent


def test_it_declares_the_elicitation_modes_its_caller_answers(tmp_path: Path) -> None:
    receipt = {"resultType": "task", "taskId": "t-1", "status": "working"}
    caps = "io.modelcontextprotocol/clientCapabilities"
    tasks = {"io.modelcontextprotocol/tasks": {}}

    client, sent = _offline_client(tmp_path, receipt)
    client.submit("confirm_action", {"action": "deploy"})
    assert sent[-1]["params"]["_meta"][caps] == {
        "extensions": tasks,
        "elicitation": {"form": {}, "url": {}},
    }

    script, sent = _offline_client(tmp_path, receipt, elicitation=())
    script.submit("confirm_action", {"action": "deploy"})
    assert sent[-1]["params"]["_meta"][caps] == {"extensions": tasks}


def test_a_call_that_asks_before_it_starts_is_journaled_as_refused(tmp_path: Path) -> None:
    from taskdesk_client import Refused

    asks = {"resultType": "input_required", "inputRequests": {"q": {}}, "requestState": "s"}
    client, sent = _offline_client(tmp_path, asks)

    with pytest.raises(Refused, match="asks for input before it starts"):
        client.submit("sync_confirm", {}, key="k1")

    assert client.resume() == []  # settled: not sent again
    with pytest.raises(Refused):
        client.submit("sync_confirm", {}, key="k1")
    assert len(sent) == 1
