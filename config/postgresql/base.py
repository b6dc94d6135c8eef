"""Django's PostgreSQL backend, checking a kept connection only when it may have gone bad.

With ``CONN_HEALTH_CHECKS`` Django sends ``SELECT 1`` before the first query of every request
that reuses a connection: one more round trip on every request, for PostgreSQL and for the
web process alike. A connection that finished a request without a database error less than
``HEALTH_CHECK_AFTER_IDLE_SECONDS`` ago, and whose socket has nothing to read, is trusted
instead. Between requests a sound connection has nothing waiting on its socket; one the
server closed (a restart, a terminated backend) has the server's goodbye or the end of the
stream, so it is checked, and replaced, before a query fails on it. A connection idle for
longer is checked as before. What remains is a connection cut without a word (a network
failure) within the second: its next query fails, Django closes it at the end of that
request, and the request answers 503 with ``Retry-After`` (``tasks_app.mcp.limits``), which
clients retry.
"""

from __future__ import annotations

import select
import time

from django.db.backends.postgresql import base


class DatabaseWrapper(base.DatabaseWrapper):
    HEALTH_CHECK_AFTER_IDLE_SECONDS = 1.0

    _last_sound = float("-inf")

    def close_if_unusable_or_obsolete(self) -> None:
        # Django calls this when a request starts and when it finishes.
        super().close_if_unusable_or_obsolete()
        if self.connection is None or self.errors_occurred:
            return
        now = time.monotonic()
        if now - self._last_sound < self.HEALTH_CHECK_AFTER_IDLE_SECONDS and self._quiet():
            self.health_check_done = True
        self._last_sound = now

    def _quiet(self) -> bool:
        """Whether nothing waits to be read on the connection's socket (one poll, no
        round trip)."""
        try:
            poller = select.poll()
            poller.register(self.connection.fileno(), select.POLLIN)
            return not poller.poll(0)
        except Exception:  # a closed or broken connection: let the health check decide
            return False

    def close(self) -> None:
        super().close()
        self._last_sound = float("-inf")
