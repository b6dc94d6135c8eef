"""The operator console: the task list at /tasks/, the task page and its actions, and a
client's webhook deliveries.

Views stay thin. Reads are selectors, which decide what the operator may see and do (tenant
and role: ``tasks_app.selectors``, ``elicitations.selectors``); the state changes are the
public transitions every other interface calls: ``transitions.request_cancel`` (as
``tasks/cancel`` does, with the operator as actor), ``runtime.reconcile_effect`` and
``outbox.send_again``. Tool and client text reaches the templates as plain strings, which the
template engine escapes.

An entry point: it may use both apps.
"""
