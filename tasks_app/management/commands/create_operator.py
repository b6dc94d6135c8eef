from __future__ import annotations

import getpass
import os
import sys
from typing import Any

from django.contrib.auth import get_user_model, password_validation
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from tasks_app import audit, operators
from tasks_app.models import AuditAction, Tenant

PASSWORD_VARIABLE = "TASKDESK_OPERATOR_PASSWORD"


class Command(BaseCommand):
    help = (
        "Create an operator (a Django user) in a tenant with a role, or change an existing "
        "one's role in that tenant (their roles in other tenants stay). The password comes "
        f"from {PASSWORD_VARIABLE} or a prompt on a terminal; it is never printed."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", required=True)
        parser.add_argument("--tenant", required=True, help="tenant slug (created if missing)")
        parser.add_argument("--role", required=True, choices=list(operators.ROLES))
        parser.add_argument("--actor", default="manage.py", help="who the audit log names")

    def handle(
        self, *args: Any, username: str, tenant: str, role: str, actor: str, **options: Any
    ) -> None:
        User = get_user_model()
        user = User.objects.filter(username=username).first()
        password = self._password(user, username)
        with transaction.atomic():
            created = user is None
            if user is None:
                user = User(username=username)
            if password is not None:
                user.set_password(password)
            user.save()
            row, new_tenant = Tenant.objects.get_or_create(slug=tenant)
            row.members.add(user)
            operators.grant_role(user, role, row)  # this tenant's only
            audit.record(audit.Who.shell(actor), AuditAction.ROLE_CHANGE, tenant=row,
                         target=f"user:{username}", role=role, created=created)  # fmt: skip
        if new_tenant:
            self.stderr.write(f"Created tenant {tenant!r}.")
        verb = "Created" if created else "Updated"
        what = "; password changed" if password is not None and not created else ""
        self.stdout.write(f"{verb} operator {username!r}: {role} in tenant {tenant!r}{what}.")

    def _password(self, user: Any, username: str) -> str | None:
        """The new password, or None to keep an existing user's."""
        password = os.environ.get(PASSWORD_VARIABLE)
        if password is None and sys.stdin.isatty():
            keep = " (empty: keep the current one)" if user is not None else ""
            password = getpass.getpass(f"Password for {username}{keep}: ")
            if password and getpass.getpass("Again: ") != password:
                raise CommandError("The passwords differ.")
            if not password and user is not None:
                return None
        if password is None:
            if user is not None:
                return None
            raise CommandError(
                f"Set {PASSWORD_VARIABLE} or run on a terminal to give the new operator a password."
            )
        try:
            password_validation.validate_password(password, user)
        except ValidationError as exc:
            raise CommandError("The password is not accepted: " + " ".join(exc.messages)) from None
        return password
