from django.conf import settings
from django.db import migrations, models
import django.db.models.deletion
import django.utils.timezone


class Migration(migrations.Migration):
    """Evaluation: the shared historical review keyed by range, commits, result, evaluator
    and tests; reports (one current per run); the plan's and batch's evaluator; the run
    tree's test outcome. The old Review table was never written (evaluation was not built),
    so it is replaced rather than altered."""

    dependencies = [
        ("replays", "0001_initial"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.DeleteModel(name="Review"),
        migrations.RemoveField(model_name="run", name="report"),
        migrations.AddField(
            model_name="run",
            name="tree_tests",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="plan",
            name="evaluator",
            field=models.CharField(blank=True, max_length=200),
        ),
        migrations.AddField(
            model_name="plan",
            name="warnings",
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.AddField(
            model_name="batch",
            name="evaluator",
            field=models.CharField(blank=True, max_length=200),
        ),
        migrations.CreateModel(
            name="Review",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("input_tokens", models.BigIntegerField(default=0)),
                ("output_tokens", models.BigIntegerField(default=0)),
                ("cache_read_tokens", models.BigIntegerField(default=0)),
                ("cache_write_5m_tokens", models.BigIntegerField(default=0)),
                ("cache_write_1h_tokens", models.BigIntegerField(default=0)),
                (
                    "cost_usd",
                    models.DecimalField(blank=True, decimal_places=6, max_digits=14, null=True),
                ),
                ("start_message_uuid", models.CharField(max_length=200)),
                ("end_message_uuid", models.CharField(max_length=200)),
                ("baseline_commit", models.CharField(max_length=40)),
                ("ending_commit", models.CharField(max_length=40)),
                ("historical_result_sha256", models.CharField(max_length=64)),
                ("evaluator", models.CharField(max_length=200)),
                ("verify_command", models.TextField(blank=True)),
                ("test_paths", models.JSONField(blank=True, default=list)),
                ("tests_digest", models.CharField(max_length=64)),
                (
                    "status",
                    models.CharField(
                        choices=[("pending", "Pending"), ("ready", "Ready"), ("failed", "Failed")],
                        default="pending",
                        max_length=20,
                    ),
                ),
                ("claimed_by", models.CharField(blank=True, max_length=320)),
                ("heartbeat_at", models.DateTimeField(blank=True, null=True)),
                ("checks", models.JSONField(blank=True, default=list)),
                ("tests", models.JSONField(blank=True, default=dict)),
                ("prompt_version", models.CharField(blank=True, max_length=40)),
                ("audit", models.JSONField(blank=True, default=dict)),
                ("seconds", models.FloatField(blank=True, null=True)),
                ("error", models.TextField(blank=True)),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                ("updated_at", models.DateTimeField(auto_now=True)),
            ],
            options={
                "ordering": ["-created_at", "-id"],
            },
        ),
        migrations.CreateModel(
            name="Report",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "status",
                    models.CharField(
                        choices=[
                            ("judging", "Judging"),
                            ("judged", "Judged"),
                            ("review_failed", "Review failed"),
                            ("lost", "Lost"),
                        ],
                        default="judging",
                        max_length=20,
                    ),
                ),
                ("is_current", models.BooleanField(default=False)),
                (
                    "winner",
                    models.CharField(
                        blank=True,
                        choices=[
                            ("historical", "Historical"),
                            ("replay", "Replay"),
                            ("tie", "Tie"),
                        ],
                        max_length=20,
                        null=True,
                    ),
                ),
                ("score_historical", models.FloatField(blank=True, null=True)),
                ("score_replay", models.FloatField(blank=True, null=True)),
                ("consistent", models.BooleanField(blank=True, null=True)),
                ("evaluator", models.CharField(max_length=200)),
                ("prompt_version", models.CharField(blank=True, max_length=40)),
                ("context", models.CharField(default="cold", max_length=20)),
                (
                    "evaluator_cost_usd",
                    models.DecimalField(blank=True, decimal_places=6, max_digits=14, null=True),
                ),
                ("evaluator_seconds", models.FloatField(blank=True, null=True)),
                ("data", models.JSONField(blank=True, default=dict)),
                ("reason", models.TextField(blank=True)),
                ("host", models.CharField(blank=True, max_length=255)),
                ("pid", models.PositiveIntegerField(blank=True, null=True)),
                ("pid_create_time", models.FloatField(blank=True, null=True)),
                ("heartbeat_at", models.DateTimeField(blank=True, null=True)),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                ("finished_at", models.DateTimeField(blank=True, null=True)),
                (
                    "requested_by",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="requested_reports",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                (
                    "review",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="reports",
                        to="replays.review",
                    ),
                ),
                (
                    "run",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="reports",
                        to="replays.run",
                    ),
                ),
            ],
            options={
                "ordering": ["-created_at", "-id"],
            },
        ),
        migrations.AddField(
            model_name="review",
            name="thread",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.CASCADE,
                related_name="reviews",
                to="replays.thread",
            ),
        ),
        migrations.AddIndex(
            model_name="report",
            index=models.Index(
                condition=models.Q(("is_current", True)),
                fields=["evaluator", "prompt_version", "winner"],
                name="report_current_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="report",
            index=models.Index(
                condition=models.Q(("status", "judging")),
                fields=["host", "status"],
                name="report_judging_idx",
            ),
        ),
        migrations.AddConstraint(
            model_name="report",
            constraint=models.UniqueConstraint(
                condition=models.Q(("is_current", True)),
                fields=("run",),
                name="report_one_current_per_run",
            ),
        ),
        migrations.AddConstraint(
            model_name="report",
            constraint=models.UniqueConstraint(
                condition=models.Q(("status", "judging")),
                fields=("run",),
                name="report_one_judging_per_run",
            ),
        ),
        migrations.AddConstraint(
            model_name="report",
            constraint=models.CheckConstraint(
                condition=models.Q(("status__in", ["judging", "judged", "review_failed", "lost"])),
                name="report_status_valid",
            ),
        ),
        migrations.AddConstraint(
            model_name="report",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("winner__isnull", True),
                    ("winner__in", ["historical", "replay", "tie"]),
                    _connector="OR",
                ),
                name="report_winner_valid",
            ),
        ),
        migrations.AddConstraint(
            model_name="report",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(("status", "judged"), ("winner__isnull", False)),
                    models.Q(
                        models.Q(("status", "judged"), _negated=True), ("winner__isnull", True)
                    ),
                    _connector="OR",
                ),
                name="report_winner_only_when_judged",
            ),
        ),
        migrations.AddConstraint(
            model_name="report",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("is_current", False),
                    ("status__in", ["judged", "review_failed"]),
                    _connector="OR",
                ),
                name="report_current_is_finished",
            ),
        ),
        migrations.AddConstraint(
            model_name="report",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("status__in", ["judging", "judged"]),
                    models.Q(("reason", ""), _negated=True),
                    _connector="OR",
                ),
                name="report_failure_has_reason",
            ),
        ),
        migrations.AddConstraint(
            model_name="report",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("score_historical__isnull", True),
                    models.Q(("score_historical__gte", 0), ("score_historical__lte", 1)),
                    _connector="OR",
                ),
                name="report_score_historical_range",
            ),
        ),
        migrations.AddConstraint(
            model_name="report",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("score_replay__isnull", True),
                    models.Q(("score_replay__gte", 0), ("score_replay__lte", 1)),
                    _connector="OR",
                ),
                name="report_score_replay_range",
            ),
        ),
        migrations.AddConstraint(
            model_name="report",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("evaluator_cost_usd__isnull", True),
                    ("evaluator_cost_usd__gte", 0),
                    _connector="OR",
                ),
                name="report_evaluator_cost_gte_0",
            ),
        ),
        migrations.AddConstraint(
            model_name="review",
            constraint=models.UniqueConstraint(
                fields=(
                    "thread",
                    "start_message_uuid",
                    "end_message_uuid",
                    "baseline_commit",
                    "ending_commit",
                    "historical_result_sha256",
                    "evaluator",
                    "tests_digest",
                ),
                name="review_unique_range",
            ),
        ),
        migrations.AddConstraint(
            model_name="review",
            constraint=models.CheckConstraint(
                condition=models.Q(("status__in", ["pending", "ready", "failed"])),
                name="review_status_valid",
            ),
        ),
        migrations.AddConstraint(
            model_name="review",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(("status", "failed"), _negated=True),
                    models.Q(("error", ""), _negated=True),
                    _connector="OR",
                ),
                name="review_failed_has_error",
            ),
        ),
        migrations.AddConstraint(
            model_name="review",
            constraint=models.CheckConstraint(
                condition=models.Q(("seconds__isnull", True), ("seconds__gte", 0), _connector="OR"),
                name="review_seconds_gte_0",
            ),
        ),
        migrations.AddConstraint(
            model_name="review",
            constraint=models.CheckConstraint(
                condition=models.Q(("input_tokens__gte", 0)), name="review_input_tokens_gte_0"
            ),
        ),
        migrations.AddConstraint(
            model_name="review",
            constraint=models.CheckConstraint(
                condition=models.Q(("output_tokens__gte", 0)), name="review_output_tokens_gte_0"
            ),
        ),
        migrations.AddConstraint(
            model_name="review",
            constraint=models.CheckConstraint(
                condition=models.Q(("cache_read_tokens__gte", 0)),
                name="review_cache_read_tokens_gte_0",
            ),
        ),
        migrations.AddConstraint(
            model_name="review",
            constraint=models.CheckConstraint(
                condition=models.Q(("cache_write_5m_tokens__gte", 0)),
                name="review_cache_write_5m_tokens_gte_0",
            ),
        ),
        migrations.AddConstraint(
            model_name="review",
            constraint=models.CheckConstraint(
                condition=models.Q(("cache_write_1h_tokens__gte", 0)),
                name="review_cache_write_1h_tokens_gte_0",
            ),
        ),
        migrations.AddConstraint(
            model_name="review",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("cost_usd__isnull", True), ("cost_usd__gte", 0), _connector="OR"
                ),
                name="review_cost_usd_gte_0",
            ),
        ),
    ]
