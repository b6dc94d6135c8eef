"""`manage.py tasks list|show|cancel|settle|rerun`: the console's task list, cancel, the
settling of an unknown effect and run again, from a shell.

The filters are the list's query keys (``--status``, ``--outcome``, ``--tool``, ``--client``,
``--q``, ``--from``, ``--to``, ``--attention``, ``--sort``), checked and applied by the same
code as /tasks/, plus ``--tenant`` (a tenant's slug). Whoever runs manage.py holds the
database's credentials, so the shell sees every tenant, as a superuser does on the pages; a
cancellation, a settled effect or a run again is recorded in the task's timeline and the audit
log as the operator ``manage.py`` (or ``--actor``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from itertools import islice
from typing import Any

from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError, CommandParser

from elicitations.selectors import overdue_task_ids
from tasks_app import audit, bulk, listing, operations, runtime, selectors
from tasks_app.listing import TaskFilters
from tasks_app.models import (
    BulkKind,
    Effect,
    EffectState,
    Task,
    Tenant,
)

# The list's query keys, as options (``--from`` is ``created_from`` inside).
FILTER_KEYS = ("status", "outcome", "tool", "client", "q", "from", "to", "sort")
SAMPLE = 10  # the ids a dry run or a cancellation names
# A bulk verb's report: the key of the tasks acted on, and of those left as they were.
REPORT_KEYS = {
    BulkKind.CANCEL: ("cancel_requested", "already_ended"),
    BulkKind.RERUN: ("ran_again", "skipped"),
}
# Who the shell reads as: every tenant (or --tenant's alone), as a superuser does; who runs
# manage.py holds the database's credentials.
SHELL = User(is_superuser=True, is_active=True)


class Command(BaseCommand):
    help = "List, show and cancel tasks, with the filters of the console's task list."

    def add_arguments(self, parser: CommandParser) -> None:
        verbs = parser.add_subparsers(
            dest="verb", required=True, metavar="list|show|cancel|settle|rerun"
        )
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
        again = verbs.add_parser(
            "rerun", help="run every matching finished task again, as Run all matching again does"
        )
        _filters(again)
        again.add_argument("--dry-run", action="store_true", help="count, run nothing")
        again.add_argument(
            "--reuse",
            choices=["default", "yes", "no"],
            default="default",
            help="replay what each task recorded (default: when it failed, was cancelled or "
            "ended with a tool error)",
        )
        again.add_argument(
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
            self._bulk(BulkKind(verb), options)

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

    def _bulk(self, kind: BulkKind, options: dict[str, Any]) -> None:
        """Cancel (or run again) all matching, as the task list's bulk actions do: the same dry
        run, record and job, run here to the end."""
        dry_run, as_json = options["dry_run"], options["json"]
        filters, tenant = _task_filters(options), options["tenant"]
        try:
            preview = bulk.preview(user=SHELL, kind=kind, filters=filters, tenant=tenant)
        except (bulk.TooMany, bulk.NotApplicable) as exc:
            raise CommandError(str(exc)) from None
        acted, left = REPORT_KEYS[kind]
        report: dict[str, Any] = {
            "dry_run": dry_run,
            "matched": preview.matched,
            acted: preview.act,
            left: preview.skipped,
            "first": [task.pk for task in preview.first[:SAMPLE]],
        }
        if not dry_run and preview.act:
            reuse = bulk.REUSE[options.get("reuse") or "default"]
            action = bulk.start(audit.Who.shell(options["actor"]), kind=kind, filters=filters,
                                until=preview.until, expected=preview.matched, tenant=tenant,
                                from_shell=True, reuse=reuse, queue=False)  # fmt: skip
            bulk.run(action.pk)
            action.refresh_from_db()
            report.update({acted: action.done, left: action.skipped, "matched": action.matched,
                           "bulk": action.pk})  # fmt: skip
        if as_json:
            self.stdout.write(json.dumps(report))
            return
        if kind == BulkKind.CANCEL:
            verb = "would request cancellation of" if dry_run else "requested cancellation of"
            rest = "had already ended"
        else:
            verb = "would run again" if dry_run else "ran again"
            rest = "were not finished or have an effect to settle"
        self.stdout.write(
            f"{report['matched']} tasks matched: {verb} {report[acted]}, {report[left]} {rest}."
        )

    def _settle(self, task_id: str, which: str, *, happened: str, note: str, actor: str) -> None:
        note = note.strip()[: runtime.RECONCILE_NOTE_MAX]
        if not note:
            raise CommandError("a note is required: write what you checked and what you found")
        effect = _effect(task_id, which)
        try:
            operations.settle_effect(effect, audit.Who.shell(actor), happened=happened == "yes",
                                     note=note)  # fmt: skip
        except runtime.NotReconcilable as exc:
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
    unknown = listing.unknown_effects_for(filters)
    return listing.tasks_for_export(
        user=SHELL,
        filters=filters,
        attention=selectors.attention_filter(overdue_task_ids=overdue_task_ids()),
        unknown_effects=unknown,
        fields=listing.RECORD_FIELDS,
        tenant=options["tenant"],
    )
