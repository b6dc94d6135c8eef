#!/usr/bin/env python
"""Django's command-line utility for administrative tasks."""

from __future__ import annotations

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django
    from django.core.management import execute_from_command_line

    from config.env import settings_errors_end_the_process

    # Set up first, so that a malformed setting ends the command with one line naming it
    # (config/env.py) rather than a traceback; the command's own setup then finds it done.
    with settings_errors_end_the_process():
        django.setup()
    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
