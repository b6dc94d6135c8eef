"""What Kubernetes needs of the settings and the probes: /livez, /readyz and /metrics answer a
probe by pod IP over plain HTTP under production settings; /readyz is the web process's own
readiness (database and broker); an injected TASKDESK_PORT=tcp://… does not stop start-up;
importing the settings writes nothing; a worker's exec probe."""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from tasks_app.models import WorkerHeartbeat
from tests.config.test_settings import PRODUCTION as SETTINGS_FOR_PRODUCTION
from tests.config.test_settings import run, run_django

PRODUCTION = {**SETTINGS_FOR_PRODUCTION, "TASKDESK_METRICS_TOKEN": "scrape-token-1234567890"}
# Requests as a probe or a scrape sends them: the pod's IP as Host, plain HTTP.
PROBES = """
from django.test import Client
c = Client(HTTP_HOST="10.1.2.3:8000")
out = {}
for path in ("/livez", "/readyz", "/healthz", "/tasks/"):
    r = c.get(path)
    out[path] = [r.status_code, r.get("Location", "")]
print(json.dumps(out))
"""


def probe(env: dict[str, str], tmp_path: Path) -> dict[str, list[object]]:
    result = run_django(f"import json\n{PROBES}", {**PRODUCTION, **env}, tmp_path)
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def test_probes_by_pod_ip_over_plain_http_get_answers_not_redirects(tmp_path) -> None:  # type: ignore[no-untyped-def]
    answers = probe({}, tmp_path)

    assert answers["/livez"] == [200, ""]
    assert answers["/readyz"] == [200, ""]  # database and broker: no worker runs here
    # Everything else keeps the host check (and the HTTPS redirect behind it).
    assert answers["/healthz"][0] == 400
    assert answers["/tasks/"][0] == 400


def test_a_scrape_by_pod_ip_over_plain_http_reads_the_metrics(client, db, settings) -> None:  # type: ignore[no-untyped-def]
    settings.ALLOWED_HOSTS = ["taskdesk.example.com"]
    settings.SECURE_SSL_REDIRECT = True
    settings.TASKDESK_METRICS_TOKEN = "scrape-token-1234567890"

    scrape = client.get("/metrics", HTTP_HOST="10.1.2.3:8000",
                        HTTP_AUTHORIZATION="Bearer scrape-token-1234567890")  # fmt: skip
    anonymous = client.get("/metrics", HTTP_HOST="10.1.2.3:8000")

    assert scrape.status_code == 200 and b"taskdesk_" in scrape.content
    assert anonymous.status_code == 401  # its own rule still holds
    assert client.get("/tasks/", HTTP_HOST="10.1.2.3:8000").status_code == 400


def test_readyz_is_503_with_the_database_down(tmp_path) -> None:  # type: ignore[no-untyped-def]
    answers = probe({"DATABASE_URL": "postgres://postgres@127.0.0.1:1/none"}, tmp_path)

    assert answers["/readyz"] == [503, ""]
    assert answers["/livez"] == [200, ""]


def test_a_port_kubernetes_injects_does_not_stop_start_up(tmp_path) -> None:  # type: ignore[no-untyped-def]
    code = "from django.conf import settings as s; print(s.PORT)"
    injected = run_django(code, {"TASKDESK_PORT": "tcp://10.0.0.1:8000", "PORT": "9001"}, tmp_path)
    ours = run_django(code, {"TASKDESK_PORT": "9002"}, tmp_path)

    assert injected.returncode == 0, injected.stderr
    assert injected.stdout.strip() == "9001"  # the injected value is left aside
    assert ours.stdout.strip() == "9002"


def test_importing_the_settings_writes_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    var = tmp_path / "var"  # does not exist
    code = "import config.settings as s; print(s.VAR_DIR, s.STATIC_ROOT)"
    env = {"DJANGO_SETTINGS_MODULE": "config.settings", **PRODUCTION}
    result = run([sys.executable, "-c", code], env, var)

    assert result.returncode == 0, result.stderr
    assert not var.exists()
    assert str(var) in result.stdout


def test_setting_the_apps_up_makes_the_folders(tmp_path) -> None:  # type: ignore[no-untyped-def]
    var = tmp_path / "var"
    result = run_django("print('ok')", {}, var)

    assert result.returncode == 0, result.stderr
    for folder in ("staticfiles", "prometheus", "broker/queue"):
        assert (var / folder).is_dir(), folder
    assert oct(os.stat(var).st_mode & 0o777) == "0o700"


# --- manage.py probe_worker ------------------------------------------------------------------


def beat_row(name: str, age: float, queues: str = "celery") -> None:
    WorkerHeartbeat.objects.update_or_create(
        hostname=name,
        defaults={"seen_at": timezone.now() - timedelta(seconds=age), "queues": queues},
    )


def test_probe_worker_exits_0_while_the_node_beats_and_1_when_it_went_stale(db, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_WORKER_STALE_SECONDS = 60
    beat_row("worker@pod-a", 3)
    beat_row("worker@pod-b", 300)

    call_command("probe_worker", "--node", "worker@pod-a")
    with pytest.raises(CommandError, match=r"worker@pod-b: last heartbeat 30\d s ago"):
        call_command("probe_worker", "--node", "worker@pod-b")
    with pytest.raises(CommandError, match="worker@pod-c: no heartbeat yet"):
        call_command("probe_worker", "--node", "worker@pod-c")


def test_probe_worker_for_beat_reads_the_newest_heartbeat_job(db, settings) -> None:  # type: ignore[no-untyped-def]
    settings.TASKDESK_WORKER_STALE_SECONDS = 60
    with pytest.raises(CommandError, match="beat: no heartbeat yet"):
        call_command("probe_worker", "--beat")
    beat_row("control-pod-1", 500, WorkerHeartbeat.BEAT)
    beat_row("control-pod-2", 2, WorkerHeartbeat.BEAT)  # another control worker ran it since

    call_command("probe_worker", "--beat")
