"""The database cache's table (settings.REPLAYS_CACHE_TABLE), so that `migrate` is all a
deployment runs: without Redis the API's throttle counts writes in it. Made whichever
cache is configured now, so dropping REDIS_URL later needs no other step."""

from django.conf import settings
from django.core.management.commands.createcachetable import Command as CreateCacheTable
from django.db import migrations


def create_cache_table(apps, schema_editor):
    command = CreateCacheTable()
    command.verbosity = 0
    command.create_table(schema_editor.connection.alias, settings.REPLAYS_CACHE_TABLE, False)


def drop_cache_table(apps, schema_editor):
    schema_editor.execute(
        f"DROP TABLE IF EXISTS {schema_editor.quote_name(settings.REPLAYS_CACHE_TABLE)}"
    )


class Migration(migrations.Migration):
    dependencies = [
        ("replays", "0005_thread_owner"),
    ]

    operations = [
        migrations.RunPython(create_cache_table, drop_cache_table),
    ]
