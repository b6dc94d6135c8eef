"""`manage.py tasks list|show|cancel|settle`: the console's task list, cancel and the
settling of an unknown effect, from a shell.

The filters are the list's query keys (``--status``, ``--outcome``, ``--tool``, ``--client``,
``--q``, ``--from``, ``--to``, ``--attention``, ``--sort``), checked and applied by the same
code as /tasks/, plus ``--tenant`` (a tenant's slug). Whoever runs manage.py holds the
database's credentials, so the shell sees every tenant, as a superuser does on the pages; a
cancellation or a settled effect is recorded in the task's timeline as the operator
``manage.py`` (or ``--actor``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import partial
from itertools import islice
from typing import Any

from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from elicitations.selectors import overdue_task_ids
from tasks_app import audit, bulk, listing, runtime, selectors
from tasks_app.listing import Outcome, TaskFilters
from tasks_app.models import (
    AuditAction,
    AuditOutcome,
    BulkKind,
    Effect,
    EffectState,
    Task,
    Tenant,
)

# The list's query keys, as options (``--from`` is ``created_from`` inside).
FILTER_KEYS = ("status", "outcome", "tool", "client", "q", "from", "to", "sort")
SAMPLE = 10  # the ids a dry run or a cancellation names
# Who the shell reads as: every tenant (or --tenant's alone), as a superuser does; who runs
# manage.py holds the database's credentials.
SHELL = User(is_superuser=True, is_active=True)


class Command(BaseCommand):
    help = "List, show and cancel tasks, with the filters of the console's task list."

    def add_arguments(self, parser: CommandParser) -> None:
        verbs = parser.add_subparsers(dest="verb", required=True, metavar="list|show|cancel|settle")
        listing_ = verbs.add_parser("list", help="the tasks the filters match, newest first")
        _filters(listing_)
        listing_.add_argument("--limit", type=int, default=50, help="at most this many (0: all)")
        show = verbs.add_parser("show", help="one task, with its arguments, result and effects")
        show.add_argument("task_id")
        show.add_argument("--json", action="store_true", help="one JSON object")
        cancel = verbs.add_parser("cancel", help="request cancellation of every matching task")
        _filters(cancel)
        cancel.add_argument("--dry-run", action="store_true", help="count, cancel nothing")
        cancel.add_argument(
            "--actor", default="manage.py", help="who the timeline and the audit log name"
        )
        settle = verbs.add_parser(
            "settle", help="say whether an unknown effect happened, as the task page's form does"
        )
        settle.add_argument("task_id")
        settle.add_argument("effect", help="the effect's number (seq, in show) or its name")
        settle.add_argument("--happened", required=True, choices=["yes", "no"])
        settle.add_argument("--note", required=True, help="what you checked and what you found")
        settle.add_argument(
            "--actor", default="manage.py", help="who the timeline and the audit log name"
        )

    def handle(self, *args: Any, verb: str, **options: Any) -> None:
        if verb == "show":
            self._show(options["task_id"], as_json=options["json"])
            return
        if verb == "settle":
            self._settle(options["task_id"], options["effect"], happened=options["happened"],
                         note=options["note"], actor=options["actor"])  # fmt: skip
            return
        if verb == "list":
            tasks, limit = _matching(options), options["limit"]
            self._list(tasks if limit <= 0 else islice(tasks, limit), as_json=options["json"])
        else:
            self._cancel(options, dry_run=options["dry_run"], actor=options["actor"],
                         as_json=options["json"])  # fmt: skip

    def _list(self, tasks: Iterator[Task], *, as_json: bool) -> None:
        for task in tasks:
            record = listing.task_record(task)
            if as_json:
                self.stdout.write(json.dumps(record, ensure_ascii=False))
            else:
                self.stdout.write(
                    f"{record['id']}  {record['tool']:<20} {record['client']:<16} "
                    f"{record['status']:<15} {record['created_at']}  {record['status_message']}"
                )

    def _show(self, task_id: str, *, as_json: bool) -> None:
        task = Task.objects.select_related("client").filter(pk=task_id).first()
        if task is None:
            raise CommandError(f"no task {task_id!r}")
        record = {
            **listing.task_record(task),
            "arguments": task.arguments,
            "result": task.result,
            "effects": [
                {"seq": seq, "name": name, "target": target, "state": state}
                for seq, name, target, state in task.effects.order_by("seq").values_list(
                    "seq", "name", "target", "state"
                )
            ],
        }
        if as_json:
            self.stdout.write(json.dumps(record, ensure_ascii=False))
            return
        for name, value in record.items():
            shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            self.stdout.write(f"{name + ':':<18}{shown}")

    def _cancel(self, options: dict[str, Any], *, dry_run: bool, actor: str, as_json: bool) -> None:
        """Cancel all matching, as the task list's bulk action does (the same dry run, record
        and job, run here to the end)."""
        filters, tenant = _task_filters(options), options["tenant"]
        try:
            preview = bulk.preview(user=SHELL, kind=BulkKind.CANCEL, filters=filters, tenant=tenant)
        except bulk.TooMany as exc:
            raise CommandError(str(exc)) from None
        report: dict[str, Any] = {
            "dry_run": dry_run,
            "matched": preview.matched,
            "cancel_requested": preview.act,
            "already_ended": preview.skipped,
            "first": [task.pk for task in preview.first[:SAMPLE]],
        }
        if not dry_run and preview.act:
            action = bulk.start(audit.Who.shell(actor), kind=BulkKind.CANCEL, filters=filters,
                                until=preview.until, expected=preview.matched, tenant=tenant,
                                from_shell=True, queue=False)  # fmt: skip
            bulk.run(action.pk)
            action.refresh_from_db()
            report.update(cancel_requested=action.done, already_ended=action.skipped,
                          matched=action.matched, bulk=action.pk)  # fmt: skip
        if as_json:
            self.stdout.write(json.dumps(report))
            return
        verb = "would request cancellation of" if dry_run else "requested cancellation of"
        self.stdout.write(
            f"{report['matched']} tasks matched: {verb} {report['cancel_requested']}, "
            f"{report['already_ended']} had already ended."
        )

    def _settle(self, task_id: str, which: str, *, happened: str, note: str, actor: str) -> None:
        note = note.strip()[: runtime.RECONCILE_NOTE_MAX]
        if not note:
            raise CommandError("a note is required: write what you checked and what you found")
        effect = _effect(task_id, which)
        who = audit.Who.shell(actor)
        settled = partial(audit.record, who, AuditAction.EFFECT_SETTLE,
                          tenant=effect.task.client.tenant_id, target=f"effect:{effect.pk}",
                          task=task_id, effect=effect.name, happened=happened == "yes",
                          note=note)  # fmt: skip
        try:
            with transaction.atomic():
                runtime.reconcile_effect(effect_id=effect.pk, happened=happened == "yes",
                                         user=who.user or User(username=actor), note=note)  # fmt: skip
                settled()
        except runtime.NotReconcilable as exc:
            settled(outcome=AuditOutcome.REFUSED, reason=str(exc))
            raise CommandError(str(exc)) from None
        verdict = "happened" if happened == "yes" else "did not happen"
        self.stdout.write(f"Recorded that {effect.name} ({effect.seq}) of {task_id} {verdict}.")


def _effect(task_id: str, which: str) -> Effect:
    """Effect WHICH (its seq, or a name only one of the task's unknown effects has) of task
    TASK_ID."""
    effects = Effect.objects.filter(task_id=task_id)
    if which.isdigit():
        found = list(effects.filter(seq=int(which)))
    else:
        found = list(effects.filter(name=which, state=EffectState.UNKNOWN).order_by("seq"))
    if len(found) > 1:
        seqs = ", ".join(str(effect.seq) for effect in found)
        raise CommandError(f"{len(found)} unknown effects named {which!r}: give one of {seqs}")
    if not found:
        raise CommandError(f"no effect {which!r} of task {task_id!r} (see: tasks show)")
    return found[0]


def _filters(parser: CommandParser) -> None:
    parser.add_argument("--tenant", default="", help="only this tenant's tasks (its slug)")
    for key in FILTER_KEYS:
        parser.add_argument(f"--{key}", default="", help=f"as ?{key}= on /tasks/")
    parser.add_argument("--attention", action="store_true", help="as ?attention=1")
    parser.add_argument("--json", action="store_true", help="JSON (a line per task for list)")


def _task_filters(options: dict[str, Any]) -> TaskFilters:
    """The task list's filters the options give, checked as /tasks/ checks them."""
    if options["tenant"] and not Tenant.objects.filter(slug=options["tenant"]).exists():
        raise CommandError(f"no tenant {options['tenant']!r}")
    query = {key: options[key] for key in FILTER_KEYS if options[key]}
    if options["attention"]:
        query["attention"] = "1"
    filters = TaskFilters.from_query(query)
    if filters.errors:
        raise CommandError(" ".join(filters.errors))
    return filters


def _matching(options: dict[str, Any]) -> Iterator[Task]:
    """The tasks the options' filters match, in their order, read in batches."""
    filters = _task_filters(options)
    unknown = (
        selectors.unknown_effect_task_ids() if filters.outcome == Outcome.UNKNOWN_EFFECT else ()
    )
    return listing.tasks_for_export(
        user=SHELL,
        filters=filters,
        attention=selectors.attention_filter(overdue_task_ids=overdue_task_ids()),
        unknown_effects=unknown,
        fields=listing.RECORD_FIELDS,
        tenant=options["tenant"],
    )
