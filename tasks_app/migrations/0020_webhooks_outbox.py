"""Webhooks: client endpoints, the outbox of messages and their delivery attempts."""

from __future__ import annotations

import django.db.models.deletion
from django.db import migrations, models

import tasks_app.models


def resend_permission(apps, schema_editor):
    """The operator role's new permission, for its group (site-wide grants in the admin);
    copied from tasks_app.operators on purpose (a migration never imports the app's code)."""
    ContentType = apps.get_model("contenttypes", "ContentType")
    Permission = apps.get_model("auth", "Permission")
    Group = apps.get_model("auth", "Group")
    content_type, _ = ContentType.objects.get_or_create(
        app_label="tasks_app", model="outboxmessage"
    )
    permission, _ = Permission.objects.get_or_create(
        content_type=content_type,
        codename="resend_outboxmessage",
        defaults={"name": "Can send a webhook again"},
    )
    for group in Group.objects.filter(name="operator"):
        group.permissions.add(permission)


class Migration(migrations.Migration):
    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("tasks_app", "0019_task_stored_bytes"),
    ]

    operations = [
        migrations.AlterField(
            model_name="taskevent",
            name="kind",
            field=models.CharField(
                choices=[
                    ("accepted", "Accepted"),
                    ("duplicate_submission", "Duplicate Submission"),
                    ("input_required", "Input Required"),
                    ("resumed", "Resumed"),
                    ("completed", "Completed"),
                    ("failed", "Failed"),
                    ("cancel_requested", "Cancel Requested"),
                    ("cancelled", "Cancelled"),
                    ("expired", "Expired"),
                    ("leg_started", "Leg Started"),
                    ("leg_suspended", "Leg Suspended"),
                    ("lease_expired", "Lease Expired"),
                    ("undo_finished", "Undo Finished"),
                    ("effect_intended", "Effect Intended"),
                    ("effect_confirmed", "Effect Confirmed"),
                    ("effect_failed", "Effect Failed"),
                    ("effect_unknown", "Effect Unknown"),
                    ("effect_verified", "Effect Verified"),
                    ("effect_retried", "Effect Retried"),
                    ("effect_needs_reconciliation", "Effect Needs Reconciliation"),
                    ("effect_reconciled", "Effect Reconciled"),
                    ("effect_compensated", "Effect Compensated"),
                    ("effect_compensation_failed", "Effect Compensation Failed"),
                    ("input_requested", "Input Requested"),
                    ("input_answered", "Input Answered"),
                    ("input_answer_rejected", "Input Answer Rejected"),
                    ("input_answer_ignored", "Input Answer Ignored"),
                    ("input_answer_refused", "Input Answer Refused"),
                    ("input_expired", "Input Expired"),
                    ("input_closed", "Input Closed"),
                    ("webhook_undelivered", "Webhook Undelivered"),
                ],
                max_length=50,
            ),
        ),
        migrations.CreateModel(
            name="OutboxMessage",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("channel", models.CharField(choices=[("webhook", "Webhook")], max_length=20)),
                ("kind", models.CharField(max_length=100)),
                (
                    "message_id",
                    models.CharField(
                        default=tasks_app.models.new_message_id, max_length=64, unique=True
                    ),
                ),
                ("recipient", models.CharField(blank=True, max_length=300)),
                ("detail", models.JSONField(blank=True, default=dict)),
                ("body", models.TextField(blank=True, null=True)),
                ("created_at", models.DateTimeField()),
                ("retry_from", models.DateTimeField()),
                ("due_at", models.DateTimeField()),
                ("attempts", models.IntegerField(default=0)),
                ("delivered_at", models.DateTimeField(blank=True, null=True)),
                ("gave_up_at", models.DateTimeField(blank=True, null=True)),
                ("last_error", models.CharField(blank=True, max_length=500)),
                (
                    "task",
                    models.ForeignKey(
                        blank=True,
                        db_constraint=False,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="outbox_messages",
                        to="tasks_app.task",
                    ),
                ),
            ],
        ),
        migrations.CreateModel(
            name="DeliveryAttempt",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("started_at", models.DateTimeField()),
                ("status_code", models.IntegerField(blank=True, null=True)),
                ("latency_ms", models.IntegerField(default=0)),
                ("ok", models.BooleanField(default=False)),
                ("error", models.CharField(blank=True, max_length=500)),
                (
                    "message",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="tries",
                        to="tasks_app.outboxmessage",
                    ),
                ),
            ],
            options={
                "ordering": ["started_at", "id"],
            },
        ),
        migrations.CreateModel(
            name="WebhookEndpoint",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("url", models.URLField(max_length=2000)),
                ("events", models.JSONField(default=list, help_text="The event types it receives")),
                ("secret", models.CharField(editable=False, max_length=200)),
                ("description", models.CharField(blank=True, max_length=200)),
                ("enabled", models.BooleanField(default=True)),
                ("failing_since", models.DateTimeField(blank=True, null=True)),
                ("disabled_at", models.DateTimeField(blank=True, null=True)),
                ("disabled_reason", models.CharField(blank=True, max_length=500)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                (
                    "client",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="webhook_endpoints",
                        to="tasks_app.client",
                    ),
                ),
            ],
        ),
        migrations.AddField(
            model_name="outboxmessage",
            name="endpoint",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="messages",
                to="tasks_app.webhookendpoint",
            ),
        ),
        migrations.AddIndex(
            model_name="webhookendpoint",
            index=models.Index(
                condition=models.Q(("enabled", True)),
                fields=["client"],
                name="webhook_enabled_client",
            ),
        ),
        migrations.AddIndex(
            model_name="outboxmessage",
            index=models.Index(
                condition=models.Q(("delivered_at__isnull", True), ("gave_up_at__isnull", True)),
                fields=["channel", "due_at"],
                name="outbox_due",
            ),
        ),
        migrations.AddIndex(
            model_name="outboxmessage",
            index=models.Index(fields=["task"], name="outbox_task"),
        ),
        migrations.AddIndex(
            model_name="outboxmessage",
            index=models.Index(fields=["endpoint", "-created_at"], name="outbox_endpoint_recent"),
        ),
        migrations.RunPython(resend_permission, migrations.RunPython.noop),
    ]
