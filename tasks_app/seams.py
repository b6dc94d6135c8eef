"""The seam between the core of tasks_app and the elicitations app.

The elicitations app builds on tasks_app: it imports task models and transitions, never the
other way round. One thing flows the other way: when a task ends, its pending questions must
close in the same transaction. ``tasks_app.transitions`` does that through the
``PendingQuestions`` protocol below, which the elicitations app registers in its
``AppConfig.ready``. The owner of ``InputRequest.status`` (``elicitations.transitions``)
stays its only writer; tasks_app never names that table.

Without a registered implementation (the elicitations app not installed), tasks have no
questions and nothing needs closing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from tasks_app.models import Task


@dataclass(frozen=True)
class StatementPart:
    """A piece of a single SQL statement that another app contributes: SQL and its named
    parameters (``%(name)s``)."""

    sql: str
    params: dict[str, Any] = field(default_factory=dict)


class PendingQuestions(Protocol):
    """How the core closes the pending questions of a task that has ended."""

    def close(self, task: Task, *, reason: str) -> None:
        """Close TASK's pending questions and record that, inside the caller's transaction
        (the Task row is already locked or updated by it)."""

    def closing_statement(self) -> StatementPart:
        """The body of a CTE named ``closed`` that closes the pending questions of the task
        in the CTE ``ended`` (one column, ``id``) and returns the ``key`` of each one it
        closed. The PostgreSQL end of a leg embeds it, so that ending a task stays a
        single statement."""


class _NoQuestions:
    def close(self, task: Task, *, reason: str) -> None:
        return None

    def closing_statement(self) -> StatementPart:
        return StatementPart("SELECT NULL::text AS key WHERE false")


_pending_questions: PendingQuestions = _NoQuestions()


def register_pending_questions(implementation: PendingQuestions) -> None:
    """Called once by the app that owns questions (``elicitations.apps``)."""
    global _pending_questions
    _pending_questions = implementation


def pending_questions() -> PendingQuestions:
    return _pending_questions
