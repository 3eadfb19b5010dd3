"""The domain: imported threads and their turns, plans, approved batches, runs.

Every rule that must hold even when two processes race is a named database
constraint; every choices field is backed by a CheckConstraint.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Exists, F, OuterRef, Prefetch, Q
from django.urls import reverse
from django.utils import timezone

from replays.runspec import RunSpec

SHA256_LENGTH = 64
COMMIT_LENGTH = 40
MODEL_ID_LENGTH = 200
MAX_MODELS_PER_PLAN = 8
MAX_THREADS_PER_PLAN = 12
# Money: micro-dollars, and up to $10^14. The most an imported session can cost is
# transcripts.base.MAX_THREAD_COST_USD ($5 * 10^11: every token kind at its bound at
# the dearest price a table may hold), so any cost that passes the import fits.
USD_MAX_DIGITS = 20
USD_DECIMAL_PLACES = 6


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
    cost_usd = models.DecimalField(
        max_digits=USD_MAX_DIGITS, decimal_places=USD_DECIMAL_PLACES, null=True, blank=True
    )

    class Meta:
        abstract = True

    @property
    def total_tokens(self) -> int:
        return sum(getattr(self, name) for name in TOKEN_FIELDS)

    @property
    def tokens(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in TOKEN_FIELDS}


class OwnedQuerySet(models.QuerySet):  # type: ignore[type-arg]
    """Rows a user may see: their own; staff see all."""

    owner_path = "owner"

    def visible_to(self, user: Any) -> OwnedQuerySet:
        if user.is_staff:
            return self
        return self.filter(**{self.owner_path: user})


class ThreadQuerySet(OwnedQuerySet):
    def search(self, text: str) -> ThreadQuerySet:
        """Threads whose title, folder or any request contains the text (case-insensitive)."""
        # NUL cannot be in stored text (PostgreSQL refuses it in a query too).
        text = text.replace("\x00", "").strip()
        if not text:
            return self
        # Exists, not a join: a thread matching in many turns is listed once.
        in_requests = Exists(Turn.objects.filter(thread=OuterRef("pk"), request__icontains=text))
        return self.filter(Q(title__icontains=text) | Q(cwd__icontains=text) | in_requests)


class RunQuerySet(OwnedQuerySet):
    owner_path = "batch__owner"

    def with_current_report(self) -> RunQuerySet:
        """Each run's current report fetched along (run.current_report asks no query)."""
        return self.prefetch_related(
            Prefetch(
                "reports",
                queryset=Report.objects.filter(is_current=True),
                to_attr="current_reports",
            )
        )

    @staticmethod
    def waiting_for_results() -> Q:
        """Runs a batch's final results still wait for: active ones, and completed ones
        without a current report."""
        reported = Exists(Report.objects.filter(run=OuterRef("pk"), is_current=True))
        return Q(status__in=ACTIVE_RUN_STATUSES) | (Q(status=RunStatus.COMPLETED) & ~reported)


class SourceKind(models.TextChoices):
    CLAUDE_CODE = "claude_code", "Claude Code"
    CODEX = "codex", "Codex"
    GEMINI = "gemini", "Gemini CLI"
    OPENCODE = "opencode", "OpenCode"
    PI = "pi", "pi"


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
    # The file's mtime at import (ns): an import that finds the same size and mtime skips
    # the file unread. Null: not known, or too recent to vouch for the content.
    source_mtime_ns = models.BigIntegerField(null=True, blank=True)
    turn_count = models.PositiveIntegerField(default=0)
    models_used = models.JSONField(default=list, blank=True)
    # The price table's entry that priced each model, over all turns: {model: entry}, the
    # entry null when none matched (the cost is then unknown).
    priced_as = models.JSONField(default=dict, blank=True)
    # Usage no turn served (work before the first request; a session whose only prompts
    # were not requests), as Turn.usage_by_model and Turn.long_context_usage. The token
    # fields and cost_usd above count it, so they are the sum of every usage in the file.
    pre_turn_usage_by_model = models.JSONField(default=dict, blank=True)
    pre_turn_long_context_usage = models.JSONField(default=dict, blank=True)
    # The costs the tool recorded itself for some of that usage, as Turn.recorded_costs.
    pre_turn_recorded_costs = models.JSONField(default=dict, blank=True)
    # Its cost; null when its price is unknown.
    pre_turn_cost_usd = models.DecimalField(
        max_digits=USD_MAX_DIGITS,
        decimal_places=USD_DECIMAL_PLACES,
        null=True,
        blank=True,
        default=0,
    )
    seconds = models.FloatField(null=True, blank=True)
    # Time the model spent answering (summed over turns); null when the transcript does not tell.
    model_seconds = models.FloatField(null=True, blank=True)
    # Who imported it: it is theirs (staff see all). Null only for threads imported before
    # threads were owned when no user existed to give them to: those only staff see.
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="threads",
    )
    imported_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    objects = ThreadQuerySet.as_manager()

    class Meta:
        ordering = [F("started_at").desc(nulls_last=True), "-id"]
        constraints = [
            # A session is imported once per owner and tool: re-import updates it in place,
            # and one user's upload never touches another's thread.
            models.UniqueConstraint(
                fields=["owner", "source_kind", "session_id"], name="thread_unique_session"
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
            # "My threads", newest first.
            models.Index(fields=["owner", "-started_at"], name="thread_owner_started_idx"),
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
    # What the user typed (a command as typed, without an IDE's blocks): pages and titles.
    request = models.TextField()
    # The request as the agent received it when that is more (the IDE's blocks around it,
    # a command's expanded text); "" when it was `request` itself. See `sent_request`.
    request_as_sent = models.TextField(blank=True, default="")
    # The user rolled this turn back (Codex): the thread went on as if it had not stood.
    rolled_back = models.BooleanField(default=False)
    # Models in the order they first answered; usage per model keeps costs recomputable.
    models_used = models.JSONField(default=list, blank=True)
    usage_by_model = models.JSONField(default=dict, blank=True)
    # The part of that usage spent by requests whose own input passed each long-context size
    # ({model: {"200000": usage}}, transcripts.base.LongContextUsage): what tiered prices need.
    long_context_usage = models.JSONField(default=dict, blank=True)
    # The price table's entry that priced each model ({model: entry or null}).
    priced_as = models.JSONField(default=dict, blank=True)
    # The costs the tool recorded itself (OpenCode, pi), per model: {model: {"usd": "0.0123",
    # "usage": {usage those requests spent}}}. That part of the model's cost is the tool's
    # figure, the rest of its usage is priced from the table (transcripts.base.RecordedCost).
    recorded_costs = models.JSONField(default=dict, blank=True)
    # Seconds from the request to the last answer that served it; null if never answered.
    seconds = models.FloatField(null=True, blank=True)
    # Time the model spent answering: each response from its request to its last line.
    model_seconds = models.FloatField(null=True, blank=True)
    last_answer_at = models.DateTimeField(null=True, blank=True)
    # What the agent's tool calls saw and changed, in order (transcripts.base.Evidence):
    # {"items": [...], "cut"?, "recorded_commit"?}; {} for turns imported before it was kept.
    evidence = models.JSONField(default=dict, blank=True)
    # The agent's last text of the turn (bounded at import, transcripts.base.MAX_FINAL_ANSWER_CHARS),
    # for the `digest` context of later requests; "" when none was recorded.
    final_answer = models.TextField(blank=True, default="")

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

    @property
    def sent_request(self) -> str:
        """The request as the historical agent received it: what a replay sends."""
        return self.request_as_sent or self.request


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
    # The evaluator that judges every run of the plan: named by the configuration, or
    # resolved once at prepare; shown before approval and checked again at approval.
    evaluator = models.CharField(max_length=MODEL_ID_LENGTH, blank=True)
    # What the user should know before approving (no evaluator, a judge of the same family).
    warnings = models.JSONField(default=list, blank=True)
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


class CampaignStatus(models.TextChoices):
    READY_FOR_APPROVAL = "ready_for_approval", "Ready for approval"
    BLOCKED = "blocked", "Blocked"
    RUNNING = "running", "Running"
    FINISHED = "finished", "Finished"
    CANCELLED = "cancelled", "Cancelled"


class Campaign(models.Model):
    """A user's own history as their benchmark: the requests a scan found replayable, a
    selection of them, models, one evaluator, a budget; approved once as a whole, then one
    plan and batch per selected request (replays.campaigns)."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="campaigns"
    )
    # The normalised input (models, evaluator, filters, selection, budget, commands...).
    configuration = models.JSONField()
    # sha256 of what is approved: the configuration and the selection with its inputs.
    fingerprint = models.CharField(max_length=SHA256_LENGTH)
    status = models.CharField(max_length=30, choices=CampaignStatus.choices)
    evaluator = models.CharField(max_length=MODEL_ID_LENGTH, blank=True)
    # Dollars the campaign may spend (null: no budget).
    budget_usd = models.DecimalField(
        max_digits=USD_MAX_DIGITS, decimal_places=USD_DECIMAL_PLACES, null=True, blank=True
    )
    # Requests scanned, eligible, gradable, excluded by reason.
    counts = models.JSONField(default=dict, blank=True)
    # Per model and in total: cost (null: unknown price) and seconds; the time at capacity.
    estimate = models.JSONField(default=dict, blank=True)
    # Per repository: the test command and where it came from.
    test_commands = models.JSONField(default=dict, blank=True)
    blockers = models.JSONField(default=list, blank=True)
    warnings = models.JSONField(default=list, blank=True)
    approval_prompt = models.CharField(max_length=500, blank=True)
    token_hash = models.CharField(max_length=SHA256_LENGTH)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    approved_at = models.DateTimeField(null=True, blank=True)
    # The results, kept up to date as its runs end and are judged (never computed per view).
    results = models.JSONField(default=dict, blank=True)
    results_updated_at = models.DateTimeField(null=True, blank=True)

    objects = OwnedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["token_hash"], name="campaign_unique_token_hash"),
            _choices_check("status", CampaignStatus, "campaign_status_valid"),
            models.CheckConstraint(
                condition=Q(expires_at__gt=F("created_at")),
                name="campaign_expires_after_creation",
            ),
            models.CheckConstraint(
                condition=Q(budget_usd__isnull=True) | Q(budget_usd__gt=0),
                name="campaign_budget_positive",
            ),
            # Approved exactly when it runs or ran.
            models.CheckConstraint(
                condition=Q(approved_at__isnull=True)
                | Q(status__in=["running", "finished", "cancelled"]),
                name="campaign_approved_runs",
            ),
        ]
        indexes = [
            models.Index(fields=["owner", "-created_at"], name="campaign_owner_created_idx"),
        ]

    def __str__(self) -> str:
        return f"Campaign {self.pk} ({self.get_status_display()})"

    def get_absolute_url(self) -> str:
        return reverse("replays:campaign-detail", args=[self.pk])

    @property
    def is_expired(self) -> bool:
        return timezone.now() >= self.expires_at


class ExclusionReason(models.TextChoices):
    """Why a scanned request is not replayed (docs/campaigns.md)."""

    NONE = "", "Eligible"
    REPOSITORY_MISSING = "repository_missing", "Repository missing"
    OUTSIDE_ROOTS = "outside_roots", "Repository outside the roots"
    NO_CODE_CHANGE = "no_code_change", "No code change"
    NEEDS_PERSON = "needs_person", "Needs a person's answer"
    ROLLED_BACK = "rolled_back", "Rolled back"
    CANNOT_REPLAY = "cannot_replay", "Cannot be replayed with a chosen model"
    BLOCKED = "blocked", "Prepare would block it"
    NOT_GRADABLE = "not_gradable", "Not gradable"


class CampaignRequest(models.Model):
    """One request a campaign scanned: eligible or excluded (with one reason), gradable
    or not (null: not known), selected or not; once approved, its plan and batch."""

    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="requests")
    thread = models.ForeignKey("Thread", on_delete=models.CASCADE, related_name="+")
    # The request as scanned. Importing a thread again replaces its turns: the row keeps
    # what it needs of its turn (null then), and the approval sees the transcript changed.
    turn = models.ForeignKey(
        "Turn", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    message_uuid = models.CharField(max_length=200)
    request = models.TextField()
    timestamp = models.DateTimeField()
    # What history spent on it: its cost (null: unknown price), seconds and tokens.
    history_cost_usd = models.DecimalField(
        max_digits=USD_MAX_DIGITS, decimal_places=USD_DECIMAL_PLACES, null=True, blank=True
    )
    history_seconds = models.FloatField(null=True, blank=True)
    history_usage = models.JSONField(default=dict, blank=True)
    # Newest first, as scanned: the selection's order.
    position = models.PositiveIntegerField()
    eligible = models.BooleanField()
    reason = models.CharField(
        max_length=30, choices=ExclusionReason.choices, blank=True, default=""
    )
    detail = models.TextField(blank=True)
    gradable = models.BooleanField(null=True, blank=True)
    gradable_detail = models.TextField(blank=True)
    selected = models.BooleanField(default=False)
    repository = models.CharField(max_length=4096, blank=True)
    verify_command = models.TextField(blank=True)
    # What prepare resolved (planning.ThreadPreparation.as_dict) for an eligible request.
    preparation = models.JSONField(default=dict, blank=True)
    plan = models.ForeignKey(
        Plan, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["campaign", "position"]
        constraints = [
            # A request is scanned once per campaign.
            models.UniqueConstraint(
                fields=["campaign", "thread", "message_uuid"], name="campaign_request_once"
            ),
            _choices_check("reason", ExclusionReason, "campaign_request_reason_valid"),
            # Eligible exactly when no reason excludes it.
            models.CheckConstraint(
                condition=(Q(eligible=True) & Q(reason="")) | (Q(eligible=False) & ~Q(reason="")),
                name="campaign_request_eligible_xor_reason",
            ),
            # Only an eligible request is selected.
            models.CheckConstraint(
                condition=Q(selected=False) | Q(eligible=True),
                name="campaign_request_selected_is_eligible",
            ),
        ]
        indexes = [
            # The campaign's selection, in order.
            models.Index(
                fields=["campaign", "position"],
                condition=Q(selected=True),
                name="campaign_request_selected_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"Campaign {self.campaign_id}: thread {self.thread_id} request {self.message_uuid}"


class Batch(models.Model):
    """An approved plan. Its runs are created in the same transaction."""

    plan = models.ForeignKey(Plan, on_delete=models.PROTECT, related_name="batches")
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="batches"
    )
    models_list = models.JSONField(default=list)
    configuration = models.JSONField(default=dict)
    thread_count = models.PositiveIntegerField()
    # The campaign this batch is one request of (null: a replay prepared on its own).
    campaign = models.ForeignKey(
        Campaign, null=True, blank=True, on_delete=models.PROTECT, related_name="batches"
    )
    # A batch has one evaluator: every run is judged by it.
    evaluator = models.CharField(max_length=MODEL_ID_LENGTH, blank=True)
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
        return not self.runs.filter(RunQuerySet.waiting_for_results()).exists()

    @property
    def runs_with_reports(self) -> RunQuerySet:
        return Run.objects.filter(batch=self).select_related("thread").with_current_report()

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
    # The agent could not work for a reason of the user's or the provider's: not logged
    # in, credentials, quota or rate limit, a model id the provider does not know, the
    # program missing, the network unreachable (replays.agents.problems).
    SETUP = "setup", "Setup problem"
    INFRASTRUCTURE = "infrastructure", "Infrastructure"
    # A campaign's member that could not start (or was stopped at its cost cap) because
    # the money left did not cover it: ours, never counted against a model.
    BUDGET_EXHAUSTED = "budget_exhausted", "Budget exhausted"
    LAUNCH_FAILED = "launch_failed", "Launch failed"
    COORDINATOR_LOST = "coordinator_lost", "Coordinator lost"


class FailureOwner(models.TextChoices):
    """Whose a failure is. Only the model's count against it on the leaderboard."""

    MODEL = "model", "the model's"
    SETUP = "setup", "setup (the user's or the provider's)"
    OURS = "ours", "ours (Replays' infrastructure)"


FAILURE_OWNERS = {
    FailureCode.AGENT_ERROR: FailureOwner.MODEL,
    FailureCode.TIMEOUT: FailureOwner.MODEL,
    FailureCode.SETUP: FailureOwner.SETUP,
    FailureCode.INFRASTRUCTURE: FailureOwner.OURS,
    FailureCode.BUDGET_EXHAUSTED: FailureOwner.OURS,
    FailureCode.LAUNCH_FAILED: FailureOwner.OURS,
    FailureCode.COORDINATOR_LOST: FailureOwner.OURS,
}


class Run(TokenTotals):
    """One member of a batch: one thread (range) replayed with one model."""

    batch = models.ForeignKey(Batch, on_delete=models.CASCADE, related_name="runs")
    thread = models.ForeignKey(Thread, on_delete=models.PROTECT, related_name="runs")
    model = models.CharField(max_length=MODEL_ID_LENGTH)
    status = models.CharField(max_length=20, choices=RunStatus.choices, default=RunStatus.QUEUED)
    phase = models.CharField(max_length=20, choices=RunPhase.choices, default=RunPhase.QUEUED)
    # The exact approved configuration this member runs with.
    configuration = models.JSONField(default=dict)
    # Copies of four of its keys, written with it at approval (approval.configuration_columns):
    # the leaderboard filters and groups on them for every run a user has, which a JSON
    # extraction per row made several times slower.
    repository = models.CharField(max_length=4096, blank=True)
    start_message_uuid = models.CharField(max_length=200, blank=True)
    end_message_uuid = models.CharField(max_length=200, blank=True)
    context = models.CharField(max_length=20, default="cold")
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
    # A campaign's member: what it is expected to cost (its request's historical tokens at
    # the model's prices), counted against the budget while it is in flight; and the most
    # it may spend, set when it is claimed (the budget left), at which its agent is stopped.
    estimated_cost_usd = models.DecimalField(
        max_digits=USD_MAX_DIGITS, decimal_places=USD_DECIMAL_PLACES, null=True, blank=True
    )
    cost_cap_usd = models.DecimalField(
        max_digits=USD_MAX_DIGITS, decimal_places=USD_DECIMAL_PLACES, null=True, blank=True
    )
    failure_code = models.CharField(
        max_length=30, choices=FailureCode.choices, blank=True, default=""
    )
    failure_message = models.TextField(blank=True)
    diff = models.TextField(blank=True)
    # The diff was longer than REPLAYS_MAX_DIFF_BYTES: `diff` is its beginning (the run
    # folder keeps it whole).
    diff_cut = models.BooleanField(default=False)
    files_changed = models.PositiveIntegerField(default=0)
    log_tail = models.TextField(blank=True)
    # The verify command's outcome on the run's own tree (checks.TreeTests), taken before
    # the worktree is removed, so the run can be judged again without it.
    tree_tests = models.JSONField(null=True, blank=True)
    # One entry per request of the range, in order (a range is replayed turn by turn):
    # {"turn", "exit_code", "seconds", "model_seconds", "cost_usd", "tokens", "session_id",
    # "files_changed", "diff" (the tree's diff after that turn; several turns only)}.
    turns = models.JSONField(default=list, blank=True)

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

    @property
    def spec(self) -> RunSpec:
        """The configuration this member was approved with, typed (replays.runspec); the
        JSON column is read here and nowhere else."""
        cached = getattr(self, "_spec", None)
        if cached is None:
            cached = self._spec = RunSpec.from_json(self.configuration)
        return cached

    @property
    def failure_owner(self) -> FailureOwner | None:
        """Whose failure this is (None unless the run failed)."""
        if self.status != RunStatus.FAILED:
            return None
        return FAILURE_OWNERS.get(FailureCode(self.failure_code), FailureOwner.OURS)

    @property
    def current_report(self) -> Report | None:
        """The latest finished judgment of this run (None before the first one)."""
        cached = getattr(self, "current_reports", None)  # set by a Prefetch
        if cached is not None:
            return cached[0] if cached else None
        return self.reports.filter(is_current=True).first()


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


class Review(TokenTotals):
    """The historical review of one range: the tests at the baseline and at the historical
    ending, and the checks the request required, derived once and shared by every model of
    every plan on that range (and evaluator, and verify command); another range never
    reuses it. Claimed like a run: the process that created the row derives it, with a
    heartbeat; the others wait, and take a stale claim over.

    Token fields and cost_usd are the evaluator's, for deriving the checks.
    """

    thread = models.ForeignKey(Thread, on_delete=models.CASCADE, related_name="reviews")
    start_message_uuid = models.CharField(max_length=200)
    end_message_uuid = models.CharField(max_length=200)
    baseline_commit = models.CharField(max_length=COMMIT_LENGTH)
    ending_commit = models.CharField(max_length=COMMIT_LENGTH)
    historical_result_sha256 = models.CharField(max_length=SHA256_LENGTH)
    evaluator = models.CharField(max_length=MODEL_ID_LENGTH)
    verify_command = models.TextField(blank=True)
    test_paths = models.JSONField(default=list, blank=True)
    # sha256 of the verify command and the test paths: part of the key (a long command
    # cannot be in a unique index itself).
    tests_digest = models.CharField(max_length=SHA256_LENGTH)
    status = models.CharField(
        max_length=20, choices=ReviewStatus.choices, default=ReviewStatus.PENDING
    )
    # Who derives it ("host:pid@create_time") and their last sign of life.
    claimed_by = models.CharField(max_length=320, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    # The historical diff itself (cut beyond REPLAYS_MAX_DIFF_BYTES), so pages and exports
    # show it from the database, on machines that do not have the repository.
    historical_diff = models.TextField(blank=True)
    historical_diff_cut = models.BooleanField(default=False)
    # [{"id": "c1", "text": "...", "source": "evaluator" | "tests"}]
    checks = models.JSONField(default=list, blank=True)
    # {"baseline": TreeTests, "historical": TreeTests, "sets": TestSets, "test_files": [...]}
    tests = models.JSONField(default=dict, blank=True)
    prompt_version = models.CharField(max_length=40, blank=True)
    # The prompt sent and the evaluator's raw reply, so every check can be audited.
    audit = models.JSONField(default=dict, blank=True)
    seconds = models.FloatField(null=True, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            # Shared by every model of every plan on that range; another range never reuses it.
            models.UniqueConstraint(
                fields=[
                    "thread",
                    "start_message_uuid",
                    "end_message_uuid",
                    "baseline_commit",
                    "ending_commit",
                    "historical_result_sha256",
                    "evaluator",
                    "tests_digest",
                ],
                name="review_unique_range",
            ),
            _choices_check("status", ReviewStatus, "review_status_valid"),
            # A failed review always says why.
            models.CheckConstraint(
                condition=~Q(status=ReviewStatus.FAILED) | ~Q(error=""),
                name="review_failed_has_error",
            ),
            models.CheckConstraint(
                condition=Q(seconds__isnull=True) | Q(seconds__gte=0),
                name="review_seconds_gte_0",
            ),
            models.CheckConstraint(
                condition=Q(cost_usd__isnull=True) | Q(cost_usd__gte=0),
                name="review_cost_usd_gte_0",
            ),
            *_non_negative(TOKEN_FIELDS, "review"),
        ]

    def __str__(self) -> str:
        return f"Review of {self.thread} by {self.evaluator}"


class ReportStatus(models.TextChoices):
    JUDGING = "judging", "Judging"
    JUDGED = "judged", "Judged"
    REVIEW_FAILED = "review_failed", "Review failed"
    LOST = "lost", "Lost"


FINISHED_REPORT_STATUSES = [ReportStatus.JUDGED, ReportStatus.REVIEW_FAILED]


class Winner(models.TextChoices):
    HISTORICAL = "historical", "Historical"
    REPLAY = "replay", "Replay"
    TIE = "tie", "Tie"


class Report(models.Model):
    """One judgment of a run against history. A run may be judged again (another
    evaluator) without running its agent again; the latest finished one is current.

    While judging, the row is the judgment's claim: the process that judges it holds
    it (host, pid and create time) and writes a heartbeat; reconcile marks a lost one
    `lost`. The columns are what the leaderboard filters and counts; the rest is in
    `data` (a versioned JSON document, see docs/reports.md).
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="reports")
    review = models.ForeignKey(
        Review, null=True, blank=True, on_delete=models.SET_NULL, related_name="reports"
    )
    status = models.CharField(
        max_length=20, choices=ReportStatus.choices, default=ReportStatus.JUDGING
    )
    is_current = models.BooleanField(default=False)
    # Null means "no winner" (not judged), which no choice stands for.
    winner = models.CharField(  # noqa: DJ001
        max_length=20, choices=Winner.choices, null=True, blank=True
    )
    score_historical = models.FloatField(null=True, blank=True)
    score_replay = models.FloatField(null=True, blank=True)
    # Both orders agreed (null when the evaluator judged in one pass, or not at all).
    consistent = models.BooleanField(null=True, blank=True)
    evaluator = models.CharField(max_length=MODEL_ID_LENGTH)
    prompt_version = models.CharField(max_length=40, blank=True)
    context = models.CharField(max_length=20, default="cold")
    # The evaluator's own cost and time for this judgment (the replay's are on the run).
    evaluator_cost_usd = models.DecimalField(
        max_digits=USD_MAX_DIGITS, decimal_places=USD_DECIMAL_PLACES, null=True, blank=True
    )
    evaluator_seconds = models.FloatField(null=True, blank=True)
    data = models.JSONField(default=dict, blank=True)
    # Why the review failed or the judgment was lost.
    reason = models.TextField(blank=True)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="requested_reports",
    )
    host = models.CharField(max_length=255, blank=True)
    pid = models.PositiveIntegerField(null=True, blank=True)
    pid_create_time = models.FloatField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            # One current report per run: what pages, the API and the leaderboard show.
            models.UniqueConstraint(
                fields=["run"], condition=Q(is_current=True), name="report_one_current_per_run"
            ),
            # Nothing is judged twice at once: one judgment in progress per run.
            models.UniqueConstraint(
                fields=["run"],
                condition=Q(status=ReportStatus.JUDGING),
                name="report_one_judging_per_run",
            ),
            _choices_check("status", ReportStatus, "report_status_valid"),
            models.CheckConstraint(
                condition=Q(winner__isnull=True) | Q(winner__in=Winner.values),
                name="report_winner_valid",
            ),
            # A judged report names its winner; any other has none.
            models.CheckConstraint(
                condition=(Q(status=ReportStatus.JUDGED) & Q(winner__isnull=False))
                | (~Q(status=ReportStatus.JUDGED) & Q(winner__isnull=True)),
                name="report_winner_only_when_judged",
            ),
            # Only a finished judgment can be the current one.
            models.CheckConstraint(
                condition=Q(is_current=False) | Q(status__in=FINISHED_REPORT_STATUSES),
                name="report_current_is_finished",
            ),
            # A review that failed, or a lost judgment, says why.
            models.CheckConstraint(
                condition=Q(status__in=[ReportStatus.JUDGING, ReportStatus.JUDGED]) | ~Q(reason=""),
                name="report_failure_has_reason",
            ),
            models.CheckConstraint(
                condition=Q(score_historical__isnull=True)
                | (Q(score_historical__gte=0) & Q(score_historical__lte=1)),
                name="report_score_historical_range",
            ),
            models.CheckConstraint(
                condition=Q(score_replay__isnull=True)
                | (Q(score_replay__gte=0) & Q(score_replay__lte=1)),
                name="report_score_replay_range",
            ),
            models.CheckConstraint(
                condition=Q(evaluator_cost_usd__isnull=True) | Q(evaluator_cost_usd__gte=0),
                name="report_evaluator_cost_gte_0",
            ),
        ]
        indexes = [
            # The leaderboard and the consistency rates: current reports by evaluator.
            models.Index(
                fields=["evaluator", "prompt_version", "winner"],
                condition=Q(is_current=True),
                name="report_current_idx",
            ),
            # Reconcile: judgments in progress.
            models.Index(
                fields=["host", "status"],
                condition=Q(status=ReportStatus.JUDGING),
                name="report_judging_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"Report {self.pk} of run {self.run_id} ({self.get_status_display()})"


class Transcript(models.Model):
    """A thread's transcript file as it was imported, compressed, in the database: prepare,
    approval and a fork read it on any machine (an upload lands on one web machine only,
    and a source file may be gone or changed since). One row per thread, kept apart from
    Thread so that lists of threads never load it."""

    thread = models.OneToOneField(Thread, on_delete=models.CASCADE, related_name="transcript")
    # How `data` is compressed ("zlib", ...): replays.transcripts.store reads it.
    codec = models.CharField(max_length=20)
    data = models.BinaryField()
    # The uncompressed file: its size and sha256 (Thread.source_sha256 when imported).
    size = models.BigIntegerField()
    sha256 = models.CharField(max_length=SHA256_LENGTH)
    stored_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(size__gte=0), name="transcript_size_gte_0"),
        ]

    def __str__(self) -> str:
        return f"Transcript of thread {self.thread_id} ({self.size:,} bytes)"


class RunLog(models.Model):
    """A run's whole agent log as it ended, compressed, in the database: the run folder on
    the worker machine is a cache, and a page served from another machine (or after the
    folder is gone) reads the log here. Kept apart from Run so that lists never load it.
    A log longer than REPLAYS_MAX_LOG_BYTES keeps its end (`cut` says how much went)."""

    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="full_log")
    # How `data` is compressed, as for Transcript (replays.transcripts.store).
    codec = models.CharField(max_length=20)
    data = models.BinaryField()
    # The log file's size when it was stored, and the bytes left out from its start.
    size = models.BigIntegerField()
    cut = models.BigIntegerField(default=0)
    stored_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(size__gte=0) & Q(cut__gte=0) & Q(cut__lte=F("size")),
                name="runlog_sizes_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"Log of run {self.run_id} ({self.size:,} bytes)"


class ApiToken(models.Model):
    """A key to the API (`Authorization: Token <key>`). Only its sha256 is kept: the key
    itself is shown once, when it is made (replays.accounts.create_api_token), so a copy
    of the database opens nobody's account."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    key_sha256 = models.CharField(max_length=SHA256_LENGTH)
    # The key's first characters, to tell a user's tokens apart (never enough to use one).
    prefix = models.CharField(max_length=8, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            # A key opens one account.
            models.UniqueConstraint(fields=["key_sha256"], name="apitoken_unique_key"),
            # A sha256 in hex, never a key kept in the clear.
            models.CheckConstraint(
                condition=Q(key_sha256__regex=r"^[0-9a-f]{64}$"), name="apitoken_key_is_sha256"
            ),
        ]

    def __str__(self) -> str:
        return f"API token {self.prefix}… of {self.user}"


class Host(models.Model):
    """One machine's django-q2 cluster (REPLAYS_HOST_NAME), as it last reported itself:
    the doctor and the pages read these. Written by the cluster at start and on its own
    schedule; `last_seen_at` is the database's clock, `clock_at` the host's own clock at
    the same write, so their difference is the host's clock skew."""

    name = models.CharField(max_length=255, unique=True)
    first_seen_at = models.DateTimeField(default=timezone.now)
    last_seen_at = models.DateTimeField()
    clock_at = models.DateTimeField()
    # REPLAYS_MAX_RUNS_PER_HOST on that host.
    capacity = models.PositiveIntegerField(default=0)
    # {"codex": "0.169.0", "claude": "2.1.1"} or {"codex": {"error": "..."}} per agent binary.
    agent_versions = models.JSONField(default=dict, blank=True)
    # What else the host said about itself: run root, repository roots, pid, versions.
    details = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name
