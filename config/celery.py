"""The Celery application. Settings come from Django's settings under the CELERY_ prefix."""

from __future__ import annotations

import os

from celery import Celery
from kombu.transport import TRANSPORT_ALIASES

# "filesystem://" (the embedded default broker) means the atomic variant in config.broker.
TRANSPORT_ALIASES["filesystem"] = "config.broker:Transport"

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("taskdesk")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
