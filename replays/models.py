"""The domain: imported threads and their turns, plans, approved batches, runs.

Every rule that must hold even when two processes race is a named database
constraint; every choices field is backed by a CheckConstraint.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Exists, F, OuterRef, Q
from django.urls import reverse
from django.utils import timezone

SHA256_LENGTH = 64
COMMIT_LENGTH = 40
MODEL_ID_LENGTH = 200
MAX_MODELS_PER_PLAN = 8
MAX_THREADS_PER_PLAN = 12


def _choices_check(
    field: str, choices: type[models.TextChoices], name: str
) -> models.CheckConstraint:
    return models.CheckConstraint(condition=Q(**{f"{field}__in": choices.values}), name=name)


def _non_negative(fields: list[str], prefix: str) -> list[models.CheckConstraint]:
    return [
        models.CheckConstraint(condition=Q(**{f"{name}__gte": 0}), name=f"{prefix}_{name}_gte_0")
        for name in fields
    ]


TOKEN_FIELDS = [
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_5m_tokens",
    "cache_write_1h_tokens",
]


class TokenTotals(models.Model):
    """Token counts by kind (disjoint: input excludes cached reads) and their cost."""

    input_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)
    cache_read_tokens = models.BigIntegerField(default=0)
    cache_write_5m_tokens = models.BigIntegerField(default=0)
    cache_write_1h_tokens = models.BigIntegerField(default=0)
    # Null means "unknown price", which is never shown as $0.
    cost_usd = models.DecimalField(max_digits=14, decimal_places=6, null=True, blank=True)

    class Meta:
        abstract = True

    @property
    def total_tokens(self) -> int:
        return sum(getattr(self, name) for name in TOKEN_FIELDS)

    @property
    def tokens(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in TOKEN_FIELDS}


class ThreadQuerySet(models.QuerySet["Thread"]):
    def search(self, text: str) -> ThreadQuerySet:
        """Threads whose title, folder or any request contains the text (case-insensitive)."""
        text = text.strip()
        if not text:
            return self
        # Exists, not a join: a thread matching in many turns is listed once.
        in_requests = Exists(Turn.objects.filter(thread=OuterRef("pk"), request__icontains=text))
        return self.filter(Q(title__icontains=text) | Q(cwd__icontains=text) | in_requests)


class OwnedQuerySet(models.QuerySet):  # type: ignore[type-arg]
    """Rows a user may see: their own; staff see all."""

    owner_path = "owner"

    def visible_to(self, user: Any) -> OwnedQuerySet:
        if user.is_staff:
            return self
        return self.filter(**{self.owner_path: user})


class RunQuerySet(OwnedQuerySet):
    owner_path = "batch__owner"


class SourceKind(models.TextChoices):
    CLAUDE_CODE = "claude_code", "Claude Code"
    CODEX = "codex", "Codex"


class Thread(TokenTotals):
    """One imported agent session."""

    source_kind = models.CharField(max_length=20, choices=SourceKind.choices)
    session_id = models.CharField(max_length=200)
    title = models.CharField(max_length=500, blank=True)
    cwd = models.CharField(max_length=4096, blank=True)
    git_branch = models.CharField(max_length=255, blank=True)
    # Codex records the commit its session started from; Claude Code does not.
    git_commit = models.CharField(max_length=COMMIT_LENGTH, blank=True)
    repository_url = models.CharField(max_length=2000, blank=True)
    cli_version = models.CharField(max_length=100, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    source_path = models.CharField(max_length=4096)
    source_sha256 = models.CharField(max_length=SHA256_LENGTH)
    source_size = models.BigIntegerField()
    turn_count = models.PositiveIntegerField(default=0)
    models_used = models.JSONField(default=list, blank=True)
    seconds = models.FloatField(null=True, blank=True)
    # Time the model spent answering (summed over turns); null when the transcript does not tell.
    model_seconds = models.FloatField(null=True, blank=True)
    imported_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="imported_threads",
    )
    imported_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    objects = ThreadQuerySet.as_manager()

    class Meta:
        ordering = [F("started_at").desc(nulls_last=True), "-id"]
        constraints = [
            # A session is imported once per tool: re-import updates it in place.
            models.UniqueConstraint(
                fields=["source_kind", "session_id"], name="thread_unique_session"
            ),
            _choices_check("source_kind", SourceKind, "thread_source_kind_valid"),
            models.CheckConstraint(
                condition=Q(source_size__gte=0), name="thread_source_size_gte_0"
            ),
            models.CheckConstraint(
                condition=Q(started_at__isnull=True)
                | Q(ended_at__isnull=True)
                | Q(ended_at__gte=F("started_at")),
                name="thread_ends_after_start",
            ),
            *_non_negative(TOKEN_FIELDS, "thread"),
        ]
        indexes = [
            # The thread list: newest first.
            models.Index(fields=["-started_at", "-id"], name="thread_started_idx"),
        ]

    def __str__(self) -> str:
        return self.title or self.session_id

    def get_absolute_url(self) -> str:
        return reverse("replays:thread-detail", args=[self.pk])


class Turn(TokenTotals):
    """One real user request inside a thread and the assistant work that answered it."""

    thread = models.ForeignKey(Thread, on_delete=models.CASCADE, related_name="turns")
    index = models.PositiveIntegerField()
    message_uuid = models.CharField(max_length=200)
    timestamp = models.DateTimeField()
    request = models.TextField()
    # Models in the order they first answered; usage per model keeps costs recomputable.
    models_used = models.JSONField(default=list, blank=True)
    usage_by_model = models.JSONField(default=dict, blank=True)
    # Seconds from the request to the last answer that served it; null if never answered.
    seconds = models.FloatField(null=True, blank=True)
    # Time the model spent answering: each response from its request to its last line.
    model_seconds = models.FloatField(null=True, blank=True)
    last_answer_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["thread", "index"]
        constraints = [
            # Turns keep their order; a range names its ends by message uuid.
            models.UniqueConstraint(fields=["thread", "index"], name="turn_unique_index"),
            models.UniqueConstraint(fields=["thread", "message_uuid"], name="turn_unique_message"),
            models.CheckConstraint(
                condition=Q(seconds__isnull=True) | Q(seconds__gte=0), name="turn_seconds_gte_0"
            ),
            *_non_negative(TOKEN_FIELDS, "turn"),
        ]

    def __str__(self) -> str:
        return f"{self.thread} #{self.index + 1}"


class PlanStatus(models.TextChoices):
    READY_FOR_APPROVAL = "ready_for_approval", "Ready for approval"
    BLOCKED = "blocked", "Blocked"
    NEEDS_USER_INPUT = "needs_user_input", "Needs user input"


class Plan(models.Model):
    """A prepared configuration waiting for a single-use approval."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="plans"
    )
    configuration = models.JSONField()
    # sha256 of the normalised configuration: approval must present the same one.
    fingerprint = models.CharField(max_length=SHA256_LENGTH)
    preparations = models.JSONField(default=list, blank=True)
    status = models.CharField(max_length=30, choices=PlanStatus.choices)
    blockers = models.JSONField(default=list, blank=True)
    questions = models.JSONField(default=list, blank=True)
    approval_prompt = models.CharField(max_length=500, blank=True)
    # Only the sha256 of the prepare token is kept; the token is shown once.
    token_hash = models.CharField(max_length=SHA256_LENGTH)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()

    objects = OwnedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["token_hash"], name="plan_unique_token_hash"),
            _choices_check("status", PlanStatus, "plan_status_valid"),
            models.CheckConstraint(
                condition=Q(expires_at__gt=F("created_at")), name="plan_expires_after_creation"
            ),
        ]
        indexes = [
            # "My plans", newest first.
            models.Index(fields=["owner", "-created_at"], name="plan_owner_created_idx"),
        ]

    def __str__(self) -> str:
        return f"Plan {self.pk} ({self.get_status_display()})"

    @property
    def batch(self) -> Batch | None:
        return self.batches.first()

    @property
    def is_expired(self) -> bool:
        return timezone.now() >= self.expires_at


class Batch(models.Model):
    """An approved plan. Its runs are created in the same transaction."""

    plan = models.ForeignKey(Plan, on_delete=models.PROTECT, related_name="batches")
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="batches"
    )
    models_list = models.JSONField(default=list)
    configuration = models.JSONField(default=dict)
    thread_count = models.PositiveIntegerField()
    approved_at = models.DateTimeField(default=timezone.now)

    objects = OwnedQuerySet.as_manager()

    class Meta:
        ordering = ["-approved_at", "-id"]
        verbose_name_plural = "batches"
        constraints = [
            # Single-use approval: a plan yields at most one batch, however many approvals race.
            models.UniqueConstraint(fields=["plan"], name="batch_one_per_plan"),
            models.CheckConstraint(
                condition=Q(thread_count__gte=1) & Q(thread_count__lte=MAX_THREADS_PER_PLAN),
                name="batch_thread_count_range",
            ),
        ]
        indexes = [
            models.Index(fields=["owner", "-approved_at"], name="batch_owner_approved_idx"),
        ]

    def __str__(self) -> str:
        return f"Batch {self.pk}"

    def get_absolute_url(self) -> str:
        return reverse("replays:batch-detail", args=[self.pk])

    @property
    def finished(self) -> bool:
        """Every run has ended (completed, failed or cancelled)."""
        return not self.runs.filter(status__in=ACTIVE_RUN_STATUSES).exists()

    @property
    def results_ready(self) -> bool:
        """Final results: every run ended and every completed run has its report."""
        waiting = Q(status__in=ACTIVE_RUN_STATUSES) | Q(
            status=RunStatus.COMPLETED, report__isnull=True
        )
        return not self.runs.filter(waiting).exists()

    @property
    def launch_errors(self) -> models.QuerySet[LaunchError]:
        return LaunchError.objects.filter(run__batch=self).order_by("id")


class RunStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    LAUNCHING = "launching", "Launching"
    RUNNING = "running", "Running"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


ACTIVE_RUN_STATUSES = [RunStatus.QUEUED, RunStatus.LAUNCHING, RunStatus.RUNNING]
FINISHED_RUN_STATUSES = [RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED]


class RunPhase(models.TextChoices):
    QUEUED = "queued", "Queued"
    WORKSPACE = "workspace", "Preparing workspace"
    IMPLEMENTING = "implementing", "Implementing"
    COLLECTING = "collecting", "Collecting results"
    REVIEWING = "reviewing", "Reviewing"
    DONE = "done", "Done"


class FailureCode(models.TextChoices):
    NONE = "", "None"
    AGENT_ERROR = "agent_error", "Agent error"
    TIMEOUT = "timeout", "Timed out"
    INFRASTRUCTURE = "infrastructure", "Infrastructure"
    LAUNCH_FAILED = "launch_failed", "Launch failed"
    COORDINATOR_LOST = "coordinator_lost", "Coordinator lost"


class Run(TokenTotals):
    """One member of a batch: one thread (range) replayed with one model."""

    batch = models.ForeignKey(Batch, on_delete=models.CASCADE, related_name="runs")
    thread = models.ForeignKey(Thread, on_delete=models.PROTECT, related_name="runs")
    model = models.CharField(max_length=MODEL_ID_LENGTH)
    status = models.CharField(max_length=20, choices=RunStatus.choices, default=RunStatus.QUEUED)
    phase = models.CharField(max_length=20, choices=RunPhase.choices, default=RunPhase.QUEUED)
    # The exact approved configuration this member runs with.
    configuration = models.JSONField(default=dict)
    host = models.CharField(max_length=255, blank=True)
    launcher = models.CharField(max_length=320, blank=True)
    pid = models.PositiveIntegerField(null=True, blank=True)
    # A pid alone does not identify a process after a restart: keep its create time too.
    pid_create_time = models.FloatField(null=True, blank=True)
    # The agent runs in its own session (process group); kept so a lost coordinator's agent can be killed.
    agent_pid = models.PositiveIntegerField(null=True, blank=True)
    agent_pid_create_time = models.FloatField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    # The run's folder (configuration, request file, log) and the git worktree inside it.
    run_dir = models.CharField(max_length=4096, blank=True)
    workspace_path = models.CharField(max_length=4096, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    claimed_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    wall_seconds = models.FloatField(null=True, blank=True)
    model_seconds = models.FloatField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    failure_code = models.CharField(
        max_length=30, choices=FailureCode.choices, blank=True, default=""
    )
    failure_message = models.TextField(blank=True)
    diff = models.TextField(blank=True)
    files_changed = models.PositiveIntegerField(default=0)
    log_tail = models.TextField(blank=True)
    report = models.JSONField(null=True, blank=True)

    objects = RunQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            # A member of a batch exists once: (batch, thread, model).
            models.UniqueConstraint(fields=["batch", "thread", "model"], name="run_unique_member"),
            _choices_check("status", RunStatus, "run_status_valid"),
            _choices_check("phase", RunPhase, "run_phase_valid"),
            _choices_check("failure_code", FailureCode, "run_failure_code_valid"),
            # A failed run always says why.
            models.CheckConstraint(
                condition=~Q(status=RunStatus.FAILED) | ~Q(failure_code=""),
                name="run_failed_has_code",
            ),
            # Only failed runs carry a failure code.
            models.CheckConstraint(
                condition=Q(status=RunStatus.FAILED) | Q(failure_code=""),
                name="run_code_only_when_failed",
            ),
            # Finished runs have an end time.
            models.CheckConstraint(
                condition=~Q(status__in=FINISHED_RUN_STATUSES) | Q(finished_at__isnull=False),
                name="run_finished_has_time",
            ),
            models.CheckConstraint(
                condition=Q(wall_seconds__isnull=True) | Q(wall_seconds__gte=0),
                name="run_wall_seconds_gte_0",
            ),
            *_non_negative(TOKEN_FIELDS, "run"),
        ]
        indexes = [
            # Dispatch and capacity: active runs in queue order (small, partial).
            models.Index(
                fields=["status", "created_at"],
                condition=Q(status__in=ACTIVE_RUN_STATUSES),
                name="run_active_idx",
            ),
            # Per-host capacity and reconcile on one host.
            models.Index(
                fields=["host", "status"],
                condition=Q(status__in=[RunStatus.LAUNCHING, RunStatus.RUNNING]),
                name="run_host_active_idx",
            ),
            # The recent runs window, newest first.
            models.Index(fields=["-created_at"], name="run_created_idx"),
        ]

    def __str__(self) -> str:
        return f"Run {self.pk} ({self.model})"

    @property
    def is_finished(self) -> bool:
        return self.status in FINISHED_RUN_STATUSES


class LaunchErrorCode(models.TextChoices):
    LAUNCH_FAILED = "launch_failed", "Launch failed"
    LAUNCHER_LOST = "launcher_lost", "Launcher lost"
    SPAWN_ERROR = "spawn_error", "Spawn error"


class LaunchError(models.Model):
    """Why a member never started. At most one per run: a member fails to launch once."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="launch_errors")
    code = models.CharField(max_length=30, choices=LaunchErrorCode.choices)
    message = models.TextField()
    host = models.CharField(max_length=255, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["run"], name="launch_error_once_per_run"),
            _choices_check("code", LaunchErrorCode, "launch_error_code_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.get_code_display()}: run {self.run_id}"


class ReviewStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    READY = "ready", "Ready"
    FAILED = "failed", "Failed"


class Review(models.Model):
    """The checks a request range required, derived once per (thread, range, evaluator)."""

    thread = models.ForeignKey(Thread, on_delete=models.CASCADE, related_name="reviews")
    start_message_uuid = models.CharField(max_length=200)
    end_message_uuid = models.CharField(max_length=200)
    evaluator = models.CharField(max_length=MODEL_ID_LENGTH)
    status = models.CharField(
        max_length=20, choices=ReviewStatus.choices, default=ReviewStatus.PENDING
    )
    checks = models.JSONField(default=list, blank=True)
    cost_usd = models.DecimalField(max_digits=14, decimal_places=6, null=True, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            # Shared by every model of every plan on that range; another range never reuses it.
            models.UniqueConstraint(
                fields=["thread", "start_message_uuid", "end_message_uuid", "evaluator"],
                name="review_unique_range",
            ),
            _choices_check("status", ReviewStatus, "review_status_valid"),
        ]

    def __str__(self) -> str:
        return f"Review of {self.thread} by {self.evaluator}"
