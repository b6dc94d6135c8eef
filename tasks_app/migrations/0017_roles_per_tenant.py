"""Roles per tenant: the members table of Tenant becomes the Membership model, with the role
the user has in that tenant.

Until now a role was a group of the user, the same in every tenant. Each membership of a user
who is not a superuser gets the user's strongest role group, and the role groups are taken
off the user, so a role set in one tenant no longer applies in the others. (The groups stay,
for site-wide grants in the admin.) The role names are copied on purpose: a migration never
imports the app's code.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

ROLES = ("operator", "answerer", "viewer")  # strongest first


def carry_roles(apps, schema_editor):
    Membership = apps.get_model("tasks_app", "Membership")
    User = apps.get_model(*settings.AUTH_USER_MODEL.split("."))
    Group = apps.get_model("auth", "Group")
    groups = {group.name: group for group in Group.objects.filter(name__in=ROLES)}
    for user in User.objects.filter(groups__name__in=ROLES).distinct():
        held = set(user.groups.filter(name__in=ROLES).values_list("name", flat=True))
        strongest = next(role for role in ROLES if role in held)
        if not user.is_superuser:
            Membership.objects.filter(user=user).update(role=strongest)
        user.groups.remove(*(groups[name] for name in held))


def restore_groups(apps, schema_editor):
    Membership = apps.get_model("tasks_app", "Membership")
    Group = apps.get_model("auth", "Group")
    groups = {group.name: group for group in Group.objects.filter(name__in=ROLES)}
    strongest: dict = {}
    for membership in Membership.objects.exclude(role="").select_related("user"):
        held = strongest.get(membership.user)
        if held is None or ROLES.index(membership.role) < ROLES.index(held):
            strongest[membership.user] = membership.role
    for user, role in strongest.items():
        if role in groups:
            user.groups.add(groups[role])


class Migration(migrations.Migration):
    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
        ("tasks_app", "0016_mcpreply_awaited"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            # The table exists: the many-to-many field's own (tenant_id, user_id, unique).
            state_operations=[
                migrations.CreateModel(
                    name="Membership",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        (
                            "tenant",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="memberships",
                                to="tasks_app.tenant",
                            ),
                        ),
                        (
                            "user",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="memberships",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                    ],
                    options={
                        "db_table": "tasks_app_tenant_members",
                        "unique_together": {("tenant", "user")},
                    },
                ),
                migrations.AlterField(
                    model_name="tenant",
                    name="members",
                    field=models.ManyToManyField(
                        blank=True,
                        related_name="tenants",
                        through="tasks_app.Membership",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            database_operations=[],
        ),
        migrations.AddField(
            model_name="membership",
            name="role",
            field=models.CharField(
                blank=True,
                choices=[
                    ("", "no role"),
                    ("viewer", "Viewer"),
                    ("answerer", "Answerer"),
                    ("operator", "Operator"),
                ],
                default="",
                max_length=20,
            ),
        ),
        migrations.RunPython(carry_roles, restore_groups),
    ]
