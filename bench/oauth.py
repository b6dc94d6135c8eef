"""Accept and ``tasks/get`` with an OAuth access token beside a static token (``make bench``).

Starts the web tier as bench/acceptance.py does (its own PostgreSQL database and Redis,
gunicorn with config/gunicorn.conf.py and the shipped settings, no Celery worker), then makes
two tokens: a static client token (``manage.py create_client_token``) and an access token of
the built-in authorization server, got through its own endpoints (dynamic registration, the
consent page approved by a signed-in person, the code exchange with PKCE) in a process that
shares the stack's settings (``python bench/oauth.py issue``). Each token's client is a
client of the same tenant.

Then wrk (16 connections, BENCH_SECONDS each) drives ``POST /mcp``: tools/call creating a
task (a fresh idempotency key every request) and tasks/get of existing tasks of the token's
client, each with the static token and with the OAuth token in the order static, OAuth, OAuth,
static (twice), so that a drift of the machine's load weighs on both alike. Prints the medians and the
ratio OAuth / static (the target: OAuth within 5 %, a ratio of at least 0.95 in req/s) and
writes them into docs/benchmarks.md (BENCH_NO_DOCS=1 leaves the docs alone).

Environment: BENCH_POSTGRES, BENCH_SECONDS (default 10), BENCH_CONNECTIONS (default 16),
BENCH_ROUNDS (default 2: how many static, OAuth, OAuth, static sequences per figure; the
median of each token's runs is the figure).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psycopg
from acceptance import (
    CONNECTIONS,
    SECONDS,
    CpuMeter,
    Figures,
    machine_line,
    need,
    wait_for_port,
    wrk,
)
from common import BIN, DOCS, ROOT, database, free_port, manage, process, say, stack_env

START, END = "<!-- oauth-bench:start -->", "<!-- oauth-bench:end -->"
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "2"))
TARGET = 0.95  # OAuth req/s at least 95 % of the static token's
TENANT = "bench"
REDIRECT_URI = "http://127.0.0.1:33418/callback"  # never called: the code is read from the 302
# (title, submit.lua mode)
FIGURES = [("accept (tools/call, new task)", "new"), ("tasks/get", "get")]
KINDS = ("static", "oauth")


# --- the OAuth token, through the built-in server's own endpoints ---------------------------


def issue() -> None:
    """Print the client name and an access token of the built-in server for TENANT, as JSON:
    a person signs in, an app registers itself, the person approves it (the consent page's
    form; the page itself is not rendered, which needs collectstatic's manifest) and the app
    exchanges the code (PKCE S256, the resource of this MCP endpoint). Runs in a
    process with the stack's environment, through Django's test client (the same views,
    middleware and Authlib as the web processes; the rows land in the stack's database)."""
    import base64
    import hashlib
    from urllib.parse import parse_qs, urlencode, urlsplit

    import django

    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    from django.contrib.auth import get_user_model
    from django.test import Client as HttpClient

    from tasks_app.models import OAuthGrant, Tenant
    from tasks_app.oauth import resource

    issuer = resource.builtin_issuer()
    http = HttpClient(HTTP_HOST=urlsplit(issuer).netloc)
    person = get_user_model().objects.create_superuser(f"bench-{secrets.token_hex(4)}")
    http.force_login(person)
    registered = http.post(
        "/oauth/register",
        data=json.dumps({"client_name": "bench-oauth", "redirect_uris": [REDIRECT_URI],
                         "token_endpoint_auth_method": "none"}),
        content_type="application/json",
    )  # fmt: skip
    assert registered.status_code == 201, registered.content
    client_id = json.loads(registered.content)["client_id"]
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest())
    query = urlencode({
        "response_type": "code", "client_id": client_id, "redirect_uri": REDIRECT_URI,
        "code_challenge": challenge.rstrip(b"=").decode(), "code_challenge_method": "S256",
        "resource": resource.resource_uri(), "scope": "tasks:call tasks:answer", "state": "b",
    })  # fmt: skip
    tenant = Tenant.objects.get(slug=TENANT)
    answer = http.post(f"/oauth/authorize?{query}", {"tenant": tenant.pk, "decision": "approve"})
    assert answer.status_code == 302, answer.content
    code = parse_qs(urlsplit(answer["Location"]).query)["code"][0]
    exchanged = http.post(
        "/oauth/token",
        data=urlencode({"grant_type": "authorization_code", "code": code, "client_id": client_id,
                        "redirect_uri": REDIRECT_URI, "code_verifier": verifier,
                        "resource": resource.resource_uri()}),
        content_type="application/x-www-form-urlencoded",
    )  # fmt: skip
    assert exchanged.status_code == 200, exchanged.content
    grant = OAuthGrant.objects.select_related("client").get(app__client_id=client_id)
    token = json.loads(exchanged.content)["access_token"]
    print(json.dumps({"client": grant.client.name, "token": token}))


def oauth_token(env: dict[str, str]) -> tuple[str, str]:
    done = subprocess.run([str(BIN / "python"), str(Path(__file__).resolve()), "issue"],
                          cwd=ROOT, env=env, capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        sys.exit(f"bench: could not get an OAuth token:\n{done.stderr[-3000:]}")
    issued = json.loads(done.stdout.strip().splitlines()[-1])
    return issued["client"], issued["token"]


# --- the run ---------------------------------------------------------------------------------


def task_ids(dsn: str, client: str, path: Path) -> Path:
    """Write up to 2,000 ids of CLIENT's tasks to PATH, one a line."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT t.id FROM tasks_app_task t JOIN tasks_app_client c ON c.id = t.client_id "
            "WHERE c.name = %s ORDER BY random() LIMIT 2000",
            (client,),
        ).fetchall()
    if not rows:
        sys.exit(f"bench: client {client} has no tasks to get")
    path.write_text("".join(f"{task_id}\n" for (task_id,) in rows))
    return path


def order() -> list[str]:
    """Static, OAuth, OAuth, static (ROUNDS times): a drift in load weighs on both alike."""
    return [*KINDS, *reversed(KINDS)] * ROUNDS


def main() -> None:
    need("wrk", "apt-get install wrk")
    redis_server = need("redis-server", "apt-get install redis-server")
    load_at_start = os.getloadavg()[0]
    workdir = Path(tempfile.mkdtemp(prefix="taskdesk-bench-oauth-"))
    web_port, redis_port = free_port(), free_port()
    results: dict[str, dict[str, list[Figures]]] = {m: {k: [] for k in KINDS} for _, m in FIGURES}
    with database("taskdesk_bench_oauth") as dsn:
        env = stack_env(dsn, workdir, web_port=web_port, redis_port=redis_port,
                        toolsets="demo", log_level="WARNING")  # fmt: skip
        # No worker ends the tasks: each client accepts some 20,000 in its runs, past the
        # shipped limit of active tasks (10,000), whose check still runs on every call.
        env["TASKDESK_MAX_ACTIVE_TASKS_PER_CLIENT"] = "1000000"
        manage(env, "migrate", "--noinput", "-v0")
        out = manage(env, "create_client_token", "--client", "bench", "--tenant", TENANT)
        tokens = {"static": out.strip().splitlines()[-1]}
        clients = {"static": "bench"}
        redis_args = [redis_server, "--port", str(redis_port), "--bind", "127.0.0.1",
                      "--save", "", "--appendonly", "no"]  # fmt: skip
        web_args = [str(BIN / "gunicorn"), "config.wsgi", "-c", "config/gunicorn.conf.py"]
        with (
            process(redis_args, env=env, log=workdir / "redis.log") as redis_proc,
            process(web_args, env=env, log=workdir / "web.log") as web,
        ):
            wait_for_port(redis_port, redis_proc, workdir / "redis.log")
            wait_for_port(web_port, web, workdir / "web.log")
            clients["oauth"], tokens["oauth"] = oauth_token(env)  # the sessions are in Redis
            say(f"static token of client bench; OAuth token of client {clients['oauth']}")
            url = f"http://127.0.0.1:{web_port}"
            health = httpx.get(f"{url}/healthz", timeout=10)
            say(f"gunicorn up; /healthz answers {health.status_code}")
            meter = CpuMeter(web=web.pid, redis=redis_proc.pid, dsn=dsn)

            def measure(kind: str, *args: str, seconds: int = SECONDS) -> Figures:
                run_env = {**env, "TASKDESK_BENCH_TOKEN": tokens[kind],
                           "TASKDESK_BENCH_RUN": secrets.token_hex(4)}  # fmt: skip
                figures = wrk(url, run_env, kind, *args, seconds=seconds, meter=meter)
                say(f"{kind:6} {args[0]:3}: {figures.rps:.0f} req/s, p50 {figures.p50_ms:.1f} "
                    f"ms, p99 {figures.p99_ms:.1f} ms, {figures.errors} errors")  # fmt: skip
                return figures

            say("warming up (3 s each)")
            for kind in KINDS:
                measure(kind, "new", seconds=3)
            for kind in order():
                results["new"][kind].append(measure(kind, "new"))
            ids = {k: task_ids(dsn, clients[k], workdir / f"ids-{k}.txt") for k in KINDS}
            for kind in order():
                results["get"][kind].append(measure(kind, "get", str(ids[kind])))
    table = render(results, machine_line(load_at_start))
    print()
    print(table)
    if os.environ.get("BENCH_NO_DOCS") != "1":
        write_docs(table)
        say(f"written to {DOCS.relative_to(ROOT)}")
    shutil.rmtree(workdir, ignore_errors=True)


# --- the table -------------------------------------------------------------------------------


def summary(runs: list[Figures]) -> dict[str, float]:
    """The medians of RUNS: req/s, p50, p99, web CPU ms per request; the sum of errors."""
    return {
        "rps": statistics.median(f.rps for f in runs),
        "p50": statistics.median(f.p50_ms for f in runs),
        "p99": statistics.median(f.p99_ms for f in runs),
        "web_ms": statistics.median((f.cpu_ms or {}).get("web", 0.0) for f in runs),
        "errors": sum(f.errors for f in runs),
    }


def render(results: dict[str, dict[str, list[Figures]]], machine: str) -> str:
    lines = [
        f"Machine: {machine}.",
        "Web: gunicorn, config/gunicorn.conf.py (the shipped web processes and threads; "
        "TASKDESK_MAX_ACTIVE_TASKS_PER_CLIENT 1,000,000, as no worker ends the tasks), "
        f"PostgreSQL and Redis on the same machine, no Celery worker; wrk -t2 -c{CONNECTIONS} "
        f"-d{SECONDS}s, static and OAuth alternately (static, OAuth, OAuth, static"
        f"{f', {ROUNDS} times' if ROUNDS > 1 else ''}), the median of each.",
        "",
        "| measurement | static token, req/s | OAuth token, req/s | OAuth / static | "
        "p50 ms, static / OAuth | p99 ms, static / OAuth | web CPU ms per request, "
        "static / OAuth | errors | target |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for title, mode in FIGURES:
        static, oauth = summary(results[mode]["static"]), summary(results[mode]["oauth"])
        ratio = oauth["rps"] / static["rps"] if static["rps"] else 0.0
        met = ratio >= TARGET and static["errors"] == oauth["errors"] == 0
        lines.append(
            f"| {title} | {static['rps']:.0f} | {oauth['rps']:.0f} | {ratio:.2f} | "
            f"{static['p50']:.1f} / {oauth['p50']:.1f} | {static['p99']:.1f} / "
            f"{oauth['p99']:.1f} | {static['web_ms']:.2f} / {oauth['web_ms']:.2f} | "
            f"{static['errors'] + oauth['errors']:.0f} | OAuth / static >= {TARGET} "
            f"({'met' if met else '**not met**'}) |"
        )
    return "\n".join(lines)


def write_docs(table: str) -> None:
    stamp = time.strftime("%Y-%m-%d", time.gmtime())
    section = f"{START}\n_Run of {stamp} (`make bench`, bench/oauth.py):_\n\n{table}\n{END}"
    text = DOCS.read_text() if DOCS.exists() else "# Benchmarks\n"
    if START in text and END in text:
        text = text[: text.index(START)] + section + text[text.index(END) + len(END) :]
    else:
        text = text.rstrip() + "\n\n## An OAuth access token beside a static token\n\n"
        text += section + "\n"
    DOCS.write_text(text)


if __name__ == "__main__":
    if sys.argv[1:] == ["issue"]:
        issue()
    else:
        main()
