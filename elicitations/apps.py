from __future__ import annotations

from django.apps import AppConfig


class ElicitationsConfig(AppConfig):
    name = "elicitations"
    verbose_name = "Input requests"

    def ready(self) -> None:
        # The seam through which a task that ends closes its pending questions.
        from elicitations.transitions import PendingQuestions
        from tasks_app import seams

        seams.register_pending_questions(PendingQuestions())
