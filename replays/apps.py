from django.apps import AppConfig


class ReplaysConfig(AppConfig):
    name = "replays"
    verbose_name = "Replays"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings
        from django.db.models.signals import post_migrate
        from django_q.signals import post_spawn

        from replays import processes, supervision, tasks

        # The crash tests' pause points work only under tests/settings.py.
        processes.enable_test_hooks(getattr(settings, "REPLAYS_TEST_HOOKS", False))

        # The dispatch and reconcile schedules exist wherever the database is migrated.
        post_migrate.connect(
            tasks.create_schedules_after_migrate,
            sender=self,
            dispatch_uid="replays.create_schedules",
        )
        # Reconcile + dispatch when a django-q2 cluster starts (see the handler for why
        # post_spawn of the first worker is the hook).
        post_spawn.connect(
            supervision.reconcile_at_cluster_start,
            dispatch_uid="replays.reconcile_at_cluster_start",
        )
