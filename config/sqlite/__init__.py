"""Django's SQLite backend with writers taking turns on a lock file (``base.DatabaseWrapper``)."""
