"""Django's PostgreSQL backend, checking a kept connection only when it has been idle.

With ``CONN_HEALTH_CHECKS`` Django sends ``SELECT 1`` before the first query of every request
that reuses a connection: one more round trip on every request, for PostgreSQL and for the
web process alike. A connection that finished a request without a database error less than
``HEALTH_CHECK_AFTER_IDLE_SECONDS`` ago is trusted instead. One broken in that moment (the
server restarted) fails its next query; Django then finds the error at the end of that
request and closes the connection, and the request answers 503 with ``Retry-After``
(``tasks_app.mcp.limits``), which clients retry. A connection idle for longer is checked as
before.
"""

from __future__ import annotations

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
        if now - self._last_sound < self.HEALTH_CHECK_AFTER_IDLE_SECONDS:
            self.health_check_done = True
        self._last_sound = now

    def close(self) -> None:
        super().close()
        self._last_sound = float("-inf")
