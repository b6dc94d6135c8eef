"""The operator API at /api/: the console's reads and actions as JSON, for scripts and CI.

Django REST framework viewsets over the same code as the pages: the list's filters and keyset
(``tasks_app.listing``), the permission-checking reads (``tasks_app.selectors``), the
transitions (``transitions.request_cancel``, ``runtime.reconcile_effect``), the bulk actions
(``tasks_app.bulk``) and the audit log (``tasks_app.audit``, one entry per action, written in
the action's transaction). A request is its operator's: a personal operator token
(``Authorization: Bearer tdo_…``, ``manage.py create_operator_token``) or the session of an
operator signed in to the console (the browsable API), with that operator's roles in each
tenant. The OpenAPI 3 schema is at /api/schema/ (drf-spectacular).

An entry point beside ``tasks_app.console``: it may use both apps, and never imports the
console (what they share lives below them).
"""
