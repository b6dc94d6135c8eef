# Taskdesk. `make run` starts everything; `make test` runs the whole suite. Both set up .venv.
SHELL := /bin/bash
PYTHON ?= $(shell for p in python3.13 python3.12 python3.11 python3; do command -v $$p >/dev/null && $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null && echo $$p && break; done)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000
export HOST PORT
export TASKDESK_PORT := $(PORT)
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: install run test lint fmt conformance bench clean-var

# uv installs the pins of constraints.txt: the same packages as pip, bytecode compiled, in 8 s
# instead of pip's 33 s into a new virtualenv on two cores. pip installs uv, pinned there too.
$(STAMP): pyproject.toml constraints.txt clients/python/pyproject.toml examples/acme-tools/pyproject.toml
	@test -n "$(PYTHON)" || { echo "Taskdesk needs Python 3.11 or newer on PATH" >&2; exit 1; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -c constraints.txt uv
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python -c constraints.txt \
	    -e '.[dev]' -e ./clients/python -e ./examples/acme-tools
	@touch $(STAMP)

install: $(STAMP)

run: install
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py collectstatic --noinput -v0
	$(BIN)/python manage.py bootstrap
	$(BIN)/python manage.py clear_metrics
	exec $(BIN)/python scripts/run_procfile.py -f Procfile --port $(PORT) --preload config.preload

# Tests keep their SQLite files, broker folder and exports apart from `make run`'s. They run in
# two passes at once (scripts/run_tests.py): TEST_WORKERS pytest-xdist workers, each with its
# own folder and broker (tests/parallel.py), beside the fault tests marked serial in one
# process. TEST_WORKERS=0 runs them all in this process.
# COVERAGE=1 adds branch coverage per package and fails under .ci/coverage-floors.json.
TEST_WORKERS ?= 4
export TEST_WORKERS COVERAGE PYTEST_ARGS TEST_SERIAL
test: export TASKDESK_VAR_DIR ?= $(CURDIR)/var/test
test: install
	$(BIN)/python scripts/run_tests.py

# The official MCP conformance suite (ten tasks-* scenarios + the 2026-07-28 and 2025-11-25
# requirement sets + the built-in authorization server's authorization-server-metadata-endpoint)
# against a real server and worker; PostgreSQL/Redis when DATABASE_URL/CELERY_BROKER_URL are set.
conformance: install
	bash scripts/conformance.sh

# Benchmarks (not part of `make test`): each starts its own database, broker and server
# processes, prints its figures and writes them into docs/benchmarks.md. The headline is
# bench/shipped.py: `make run` itself (PostgreSQL + Redis, then the embedded default) side by
# side with the FastMCP-tasks peer (../shared/bench/side_by_side.sh); the others isolate parts
# (bench/oauth.py: accept and tasks/get with an OAuth access token beside a static token).
bench: install
	@command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk; }
	@command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || { apt-get update -qq && apt-get install -y -qq nginx; }
	BENCH_STACK=$${BENCH_STACK:-both} $(BIN)/python bench/shipped.py
	$(BIN)/python bench/acceptance.py
	$(BIN)/python bench/oauth.py
	$(BIN)/python bench/runtime.py
	$(BIN)/python bench/dashboard.py
	$(BIN)/python bench/streams.py

# Style, the import contracts and cycles (pyproject.toml [tool.importlinter]), the drawing of
# the stack in docs/architecture.md against those contracts, the types (mypy --strict,
# [tool.mypy]) and the operator API's OpenAPI schema (valid, and generated without a warning).
# Every check runs; the target fails if any of them fails.
lint: install
	@failed=0; \
	for check in "$(BIN)/ruff check ." "$(BIN)/ruff format --check ." \
	    "$(BIN)/lint-imports --no-logo" "$(BIN)/python scripts/import_cycles.py" \
	    "$(BIN)/python scripts/check_architecture.py" "$(BIN)/mypy" \
	    "$(BIN)/python manage.py spectacular --validate --fail-on-warn --file /dev/null"; do \
	  echo "==> $$check"; $$check || failed=1; \
	done; \
	exit $$failed

fmt: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean-var:
	rm -rf var
