from datetime import timedelta

from django.conf import settings
from django.db import migrations
from django.utils import timezone


def give_deadlines(apps, schema_editor):
    """Every question has a deadline: the pending ones asked without get the default one,
    counted from now (so none is declined at once by the upgrade)."""
    InputRequest = apps.get_model("elicitations", "InputRequest")
    deadline = timezone.now() + timedelta(seconds=settings.TASKDESK_QUESTION_DEADLINE_SECONDS)
    InputRequest.objects.filter(status="pending", deadline__isnull=True).update(deadline=deadline)


class Migration(migrations.Migration):
    dependencies = [
        ("elicitations", "0001_initial"),
    ]

    operations = [migrations.RunPython(give_deadlines, migrations.RunPython.noop)]
