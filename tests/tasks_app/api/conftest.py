"""The operator API's personas: a token of each of conftest's operators, and a client that
sends one.

- ``operator_token``: olga's (operator in acme): reads acme's tasks, cancels and settles them.
- ``viewer_token``: vera's (viewer in acme): reads acme's tasks, changes nothing.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from tasks_app import bulk, tokens


class Api:
    """Requests to /api/ with a bearer token (None: none), JSON in and out."""

    def __init__(self, client: Client, token: str | None) -> None:
        self.client, self.token = client, token

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def get(self, path: str, query: dict[str, Any] | None = None) -> Any:
        return self.client.get(path, query or {}, headers=self._headers())

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return self.client.post(path, json.dumps(body or {}), content_type="application/json",
                                headers=self._headers())  # fmt: skip


@pytest.fixture
def operator_token(operator) -> str:  # type: ignore[no-untyped-def]
    return tokens.issue_operator_token(operator, "tests")[1]


@pytest.fixture
def viewer_token(viewer) -> str:  # type: ignore[no-untyped-def]
    return tokens.issue_operator_token(viewer, "tests")[1]


@pytest.fixture
def as_operator(client, operator_token) -> Api:  # type: ignore[no-untyped-def]
    return Api(client, operator_token)


@pytest.fixture
def as_viewer(client, viewer_token) -> Api:  # type: ignore[no-untyped-def]
    return Api(client, viewer_token)


@pytest.fixture
def run_jobs(monkeypatch, django_capture_on_commit_callbacks):  # type: ignore[no-untyped-def]
    """A started bulk action's job runs in the test's process once its transaction commits
    (a test's transaction never commits: its commit callbacks are captured and run)."""
    monkeypatch.setattr(bulk, "enqueue", lambda bulk_id: bulk.run(bulk_id))
    return lambda: django_capture_on_commit_callbacks(execute=True)
