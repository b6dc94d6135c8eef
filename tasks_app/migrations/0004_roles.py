"""The operator roles: groups viewer, answerer and operator, and the permissions they hold.

Tenant members who are not superusers could answer questions before roles existed; they keep
exactly that as answerers. The definitions are copied here on purpose (a migration never
imports the app's code): tasks_app.operators.ROLES is the live copy.
"""

from django.db import migrations

# codename -> (app label, model, description)
PERMISSIONS = {
    "view_task": ("tasks_app", "task", "Can view task"),
    "view_inputrequest": ("elicitations", "inputrequest", "Can view input request"),
    "answer_inputrequest": ("elicitations", "inputrequest", "Can answer questions in the inbox"),
    "cancel_task": ("tasks_app", "task", "Can request cancellation of tasks"),
    "reconcile_effect": ("tasks_app", "effect", "Can reconcile effects whose outcome is unknown"),
}
VIEW = ("view_task", "view_inputrequest")
ROLES = {
    "viewer": VIEW,
    "answerer": (*VIEW, "answer_inputrequest"),
    "operator": (*VIEW, "answer_inputrequest", "cancel_task", "reconcile_effect"),
}


def create_roles(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    Permission = apps.get_model("auth", "Permission")
    Group = apps.get_model("auth", "Group")
    Tenant = apps.get_model("tasks_app", "Tenant")
    permissions = {}
    for codename, (app_label, model, description) in PERMISSIONS.items():
        content_type, _ = ContentType.objects.get_or_create(app_label=app_label, model=model)
        permissions[codename], _ = Permission.objects.get_or_create(
            content_type=content_type, codename=codename, defaults={"name": description}
        )
    groups = {}
    for role, codenames in ROLES.items():
        groups[role], _ = Group.objects.get_or_create(name=role)
        groups[role].permissions.add(*(permissions[c] for c in codenames))
    for tenant in Tenant.objects.all():
        for user in tenant.members.filter(is_superuser=False):
            if not user.groups.filter(name__in=ROLES).exists():
                user.groups.add(groups["answerer"])


class Migration(migrations.Migration):
    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("elicitations", "0001_initial"),
        ("tasks_app", "0003_effect_compensable"),
    ]

    operations = [migrations.RunPython(create_roles, migrations.RunPython.noop)]
