#!/usr/bin/env python
"""Django's command-line utility for administrative tasks."""

from __future__ import annotations

import sys


def main() -> None:
    # The repository's own name for the settings package (the wheel's `taskdesk` command is
    # the same function under the name `taskdesk`: config/cli.py).
    from config.cli import manage

    manage(sys.argv)


if __name__ == "__main__":
    main()
