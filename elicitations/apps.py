from __future__ import annotations

from django.apps import AppConfig


class ElicitationsConfig(AppConfig):
    name = "elicitations"
    verbose_name = "Input requests"
