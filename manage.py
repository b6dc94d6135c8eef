#!/usr/bin/env python
"""Django's command-line utility for administrative tasks."""

from __future__ import annotations

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    from django.apps import apps
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    from config.env import one_line

    try:
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as error:
        if apps.ready:  # raised by the command itself: its traceback says where
            raise
        # Loading the settings or setting the apps up failed: a malformed setting, which
        # ends the command with one line naming it (config/env.py).
        raise SystemExit(one_line(error)) from None


if __name__ == "__main__":
    main()
