"""Threads belong to who imported them: `imported_by` becomes `owner`, and a session is
unique per owner and tool (one user's upload never replaces another's turns). Threads
imported with no user are given to the first staff user (else the first user); with no
user at all they stay ownerless, seen by staff only."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def give_ownerless_threads_an_owner(apps, schema_editor):
    Thread = apps.get_model("replays", "Thread")
    User = apps.get_model(*settings.AUTH_USER_MODEL.split("."))
    owner = (
        User.objects.filter(is_staff=True).order_by("id").first()
        or User.objects.order_by("id").first()
    )
    if owner is not None:
        Thread.objects.filter(owner__isnull=True).update(owner=owner)


class Migration(migrations.Migration):
    dependencies = [
        ("replays", "0004_wider_money_fields"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RemoveConstraint(model_name="thread", name="thread_unique_session"),
        migrations.RenameField(model_name="thread", old_name="imported_by", new_name="owner"),
        migrations.AlterField(
            model_name="thread",
            name="owner",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="threads",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AddConstraint(
            model_name="thread",
            constraint=models.UniqueConstraint(
                fields=("owner", "source_kind", "session_id"), name="thread_unique_session"
            ),
        ),
        migrations.AddIndex(
            model_name="thread",
            index=models.Index(fields=["owner", "-started_at"], name="thread_owner_started_idx"),
        ),
        # Last: on PostgreSQL an ALTER TABLE after rows were updated in the same transaction
        # fails ("pending trigger events"). The old constraint (kind, session) kept sessions
        # unique, so giving them one owner cannot break the new one.
        migrations.RunPython(give_ownerless_threads_an_owner, migrations.RunPython.noop),
    ]
