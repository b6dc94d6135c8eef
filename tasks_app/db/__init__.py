"""The hot-path statements: accepting a call, claiming and renewing a lease, draining, ending
a leg, and the prepared task read.

Every ``tools/call``, every leg and every ``tasks/get`` runs these, so they are written as
SQL once per process instead of being built by the ORM on each call (building the query cost
more CPU than running it). ``backend()`` returns the ``Backend`` of this process's database,
one of two implementations of the same operations (``tasks_app.db.backend``).

- Each concern has its module: ``accepting``, ``claiming`` (claims and leases), ``drainers``
  (draining), ``ending`` (a leg's end) and ``reads``; ``results`` holds what they return,
  ``rows`` how rows become tasks, ``prepared`` how a statement runs, and ``clock`` the
  database's clock.
- Each statement is a module-level constant with named parameters (``%(name)s``), written
  once per backend where the backends differ and once where they do not.

Who writes what here:

- ``Task.status``: only ``end_leased`` changes it, and only ``tasks_app.transitions`` calls
  that (``insert_or_get`` inserts new rows as ``working``).
- The lease columns (``lease_owner``, ``lease_expires_at``, ``leg``): this package is their
  only writer (``claim``, ``claim_next``, ``renew``, ``release``, ``expire_lease`` and the
  end of a leg, which clears the lease in the statement that ends the task).

Leases are fenced and kept on the database's clock (``clock``): a claim sets
``lease_expires_at`` to the database's time plus the lease length and bumps ``leg``, the
lease generation; every comparison with a lease expiry (claimable, renewal, expiry, a leg's
writes) is made in SQL against the database's clock, never a worker's. ``lock_leased`` and
the end of a leg check the fence: the lease is still (owner, generation) and not expired.
"""

from __future__ import annotations

from tasks_app.db.backend import Backend, PostgreSQL, SQLite, backend
from tasks_app.db.reads import tenant_of
from tasks_app.db.results import (
    Accepted,
    Claim,
    Ended,
    Ending,
    Existing,
    LookAfterEnd,
    Looked,
    Next,
    look_after_end,
)

__all__ = [
    "Accepted",
    "Backend",
    "Claim",
    "Ended",
    "Ending",
    "Existing",
    "LookAfterEnd",
    "Looked",
    "Next",
    "PostgreSQL",
    "SQLite",
    "backend",
    "look_after_end",
    "tenant_of",
]
