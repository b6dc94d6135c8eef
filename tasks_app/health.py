"""Health of the parts Taskdesk needs: the database, the broker, the workers and beat.

``report(WEB)`` is ``/readyz``: what a web process needs to serve, its database and its
broker (a worker or beat that stopped does not take the web processes out of service).
``report(DEPLOYMENT)`` is ``/healthz``: the database, the broker and the heartbeats (a
heartbeat that never reported is not a failure: a fresh install answers ok);
``report(STRICT)`` is ``/healthz?strict=1``: the same, but every heartbeat must exist and be
fresh, so that the deployment can do work now. There are three heartbeats
(``WorkerHeartbeat.newest_by_role``).
Each worker's main process writes its own row (``tasks_app.tasks``), so a fresh row of a
worker consuming the leg queue shows that legs can run (``legs``), and a fresh row of a
worker consuming the control queue alone that a control worker runs (``control``). The
``beat`` row is written by ``heartbeat_job``, which only beat schedules (every 10 s) and a
control worker runs, so a fresh one shows that beat runs too: the periodic jobs (sweeper,
deadlines, purge) are being sent.
``redacted`` drops exception text for callers who are not staff; ``anonymous`` keeps only
the status, for callers who are not logged in and send no metrics token.
"""

from __future__ import annotations

import os
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from tasks_app import celery_app

# What a report covers (``report``).
WEB, DEPLOYMENT, STRICT = "web", "deployment", "strict"


def check_database() -> dict[str, Any]:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"ok": True, "vendor": connection.vendor}


def check_broker() -> dict[str, Any]:
    app = celery_app()

    url = settings.CELERY_BROKER_URL
    scheme = url.split("://", 1)[0]
    if scheme == "filesystem":
        folder = str(settings.CELERY_BROKER_TRANSPORT_OPTIONS["data_folder_in"])
        ok = os.path.isdir(folder) and os.access(folder, os.W_OK)
        return {"ok": ok, "transport": "filesystem"} | (
            {} if ok else {"error": f"{folder} not writable"}
        )
    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
    except Exception as exc:
        return {"ok": False, "transport": scheme, "error": f"{type(exc).__name__}: {exc}"}
    return {"ok": True, "transport": scheme}


def check_workers(*, required: bool = False) -> dict[str, Any]:
    """The heartbeats of the workers that take legs, of the control workers and of beat
    (``heartbeat_job``'s row). REQUIRED (``/healthz?strict=1``): each must exist; either way,
    a stale one fails."""
    from tasks_app.models import WorkerHeartbeat

    try:
        last = WorkerHeartbeat.newest_by_role()
    except Exception as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    parts = {
        "legs": _heartbeat(last[WorkerHeartbeat.LEGS], "a worker taking legs", required),
        "control": _heartbeat(last[WorkerHeartbeat.CONTROL], "the control worker", required),
        "beat": _heartbeat(
            last[WorkerHeartbeat.BEAT],
            "beat (its heartbeat job, run by a control worker)",
            required,
        ),
    }
    newest = max((seen for seen in last.values() if seen is not None), default=None)
    out: dict[str, Any] = {
        "ok": all(part["ok"] for part in parts.values()),
        "heartbeat": newest.isoformat() if newest else None,
        **parts,
    }
    errors = [part["error"] for part in parts.values() if "error" in part]
    if errors:
        out["error"] = "; ".join(errors)
    return out


def heartbeat_stale(age_seconds: float) -> bool:
    """Whether a heartbeat AGE_SECONDS old is stale: older than
    TASKDESK_WORKER_STALE_SECONDS (/healthz and the console's /workers/)."""
    return age_seconds > settings.TASKDESK_WORKER_STALE_SECONDS


def _heartbeat(last: Any, who: str, required: bool) -> dict[str, Any]:
    if last is None:
        if required:
            return {"ok": False, "heartbeat": None, "error": f"{who}: no heartbeat yet"}
        return {"ok": True, "heartbeat": None}  # a fresh install: nothing reported yet
    age = (timezone.now() - last).total_seconds()
    ok = not heartbeat_stale(age)
    out: dict[str, Any] = {"ok": ok, "heartbeat": last.isoformat(), "age_seconds": round(age, 1)}
    if not ok:
        out["error"] = f"{who}: last heartbeat {age:.0f} s ago"
    return out


def deploy_warnings() -> list[str]:
    """What is wrong for a deployment without stopping this process from working."""
    warnings = []
    if settings.SECRET_KEY_GENERATED:
        warnings.append(
            "SECRET_KEY was generated on this host (TASKDESK_VAR_DIR/secret_key): processes "
            "on other hosts generate their own and reject each other's signed values. Set "
            "the same SECRET_KEY (or SECRET_KEY_FILE) for every process."
        )
    return warnings


def report(scope: str = DEPLOYMENT) -> tuple[bool, dict[str, Any]]:
    """(healthy, body) for SCOPE: WEB (database and broker), DEPLOYMENT (and the heartbeats,
    a missing one allowed) or STRICT (every heartbeat present and fresh)."""
    parts = {"database": check_database(), "broker": check_broker()}
    if scope != WEB:
        parts["workers"] = (
            check_workers(required=scope == STRICT)
            if parts["database"]["ok"]
            else {"ok": False, "error": "database down"}
        )
    failing = [name for name, part in parts.items() if not part["ok"]]
    body = {"status": "ok" if not failing else "fail", "failing": failing, **parts}
    # Warnings do not make it fail: a single host works with a generated key.
    body["warnings"] = deploy_warnings()
    return not failing, body


def redacted(body: dict[str, Any]) -> dict[str, Any]:
    """BODY without exception text (which can name hosts, users and paths): each failing
    part says only that it is unavailable."""
    out: dict[str, Any] = {}
    for name, part in body.items():
        if isinstance(part, dict) and "error" in part:
            part = {**part, "error": "unavailable"}
        out[name] = part
    return out


def anonymous(body: dict[str, Any]) -> dict[str, Any]:
    """What anyone may see of BODY: the status alone (the HTTP status says the same). The
    parts name the database vendor, the broker transport and the heartbeat times, and the
    warnings the deployment's weak spots."""
    return {"status": body["status"]}
