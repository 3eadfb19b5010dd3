from __future__ import annotations

from typing import Any

from django.core.validators import RegexValidator
from rest_framework import serializers

from replays import planning, runspec
from replays.models import (
    MAX_MODELS_PER_PLAN,
    MAX_THREADS_PER_PLAN,
    MODEL_ID_LENGTH,
    USD_DECIMAL_PLACES,
    USD_MAX_DIGITS,
    Thread,
    Turn,
)

TOKEN_KINDS = {
    "input": "input_tokens",
    "output": "output_tokens",
    "cache_read": "cache_read_tokens",
    "cache_write_5m": "cache_write_5m_tokens",
    "cache_write_1h": "cache_write_1h_tokens",
}


def cost_field() -> serializers.DecimalField:
    """Dollars as a JSON number; null (never 0) when a model's price is unknown."""
    return serializers.DecimalField(
        max_digits=USD_MAX_DIGITS,
        decimal_places=USD_DECIMAL_PLACES,
        allow_null=True,
        coerce_to_string=False,
        help_text="Null when a model's price is unknown (never reported as 0).",
    )


class TokensSerializer(serializers.Serializer):
    """Token counts by kind; the kinds are disjoint (input excludes cached reads)."""

    input = serializers.IntegerField()
    output = serializers.IntegerField()
    cache_read = serializers.IntegerField()
    cache_write_5m = serializers.IntegerField()
    cache_write_1h = serializers.IntegerField()
    total = serializers.IntegerField()

    def to_representation(self, instance: Thread | Turn) -> dict[str, int]:
        tokens = {kind: getattr(instance, field) for kind, field in TOKEN_KINDS.items()}
        tokens["total"] = sum(tokens.values())
        return tokens


def priced_as_field() -> serializers.DictField:
    return serializers.DictField(
        child=serializers.CharField(allow_null=True),
        help_text="The price table's entry that priced each model that used tokens ("
        '":free" for a free variant); null when no entry matches (the cost is then unknown).',
    )


class TurnSerializer(serializers.ModelSerializer):
    models = serializers.ListField(source="models_used", child=serializers.CharField())
    tokens = TokensSerializer(source="*")
    cost_usd = cost_field()
    request = serializers.CharField(
        help_text="What the user typed: a command as typed, without an IDE's blocks."
    )
    request_as_sent = serializers.CharField(
        help_text="The request as the agent received it, when that is more than `request` "
        "(the IDE's blocks, a command's expanded text); empty when it was `request` itself. "
        "A replay sends this."
    )
    rolled_back = serializers.BooleanField(
        help_text="The user rolled this request back (Codex): the thread went on without "
        "it; it is not offered for replay. Its tokens were still spent."
    )
    priced_as = priced_as_field()

    class Meta:
        model = Turn
        fields = [
            "message_uuid",
            "index",
            "timestamp",
            "request",
            "request_as_sent",
            "rolled_back",
            "models",
            "tokens",
            "cost_usd",
            "priced_as",
            "seconds",
            "model_seconds",
        ]


class PreTurnTokensSerializer(TokensSerializer):
    def to_representation(self, instance: Thread) -> dict[str, int]:  # type: ignore[override]
        usage = instance.pre_turn_usage_by_model.values()
        tokens = {kind: sum(u.get(field, 0) for u in usage) for kind, field in TOKEN_KINDS.items()}
        tokens["total"] = sum(tokens.values())
        return tokens


class PreTurnSerializer(serializers.Serializer):
    """Usage no turn served: the work before the first request. The thread's tokens and
    cost include it."""

    models = serializers.ListField(child=serializers.CharField())
    tokens = PreTurnTokensSerializer(source="*")
    cost_usd = cost_field()

    def to_representation(self, instance: Thread) -> dict[str, Any]:  # type: ignore[override]
        return {
            "models": list(instance.pre_turn_usage_by_model),
            "tokens": PreTurnTokensSerializer(instance).data,
            "cost_usd": self.fields["cost_usd"].to_representation(instance.pre_turn_cost_usd)
            if instance.pre_turn_cost_usd is not None
            else None,
        }


class ThreadSerializer(serializers.ModelSerializer):
    models = serializers.ListField(source="models_used", child=serializers.CharField())
    tokens = TokensSerializer(source="*")
    cost_usd = cost_field()
    priced_as = priced_as_field()
    before_first_turn = PreTurnSerializer(source="*", read_only=True)
    url = serializers.HyperlinkedIdentityField(view_name="api-thread-detail")

    class Meta:
        model = Thread
        fields = [
            "id",
            "url",
            "source_kind",
            "session_id",
            "title",
            "cwd",
            "git_branch",
            "git_commit",
            "repository_url",
            "cli_version",
            "started_at",
            "ended_at",
            "turn_count",
            "models",
            "tokens",
            "cost_usd",
            "priced_as",
            "before_first_turn",
            "seconds",
            "model_seconds",
            "source_path",
            "source_sha256",
            "source_size",
            "imported_at",
            "updated_at",
        ]


class ThreadDetailSerializer(ThreadSerializer):
    turns = TurnSerializer(many=True, read_only=True)

    class Meta(ThreadSerializer.Meta):
        fields = [*ThreadSerializer.Meta.fields, "turns"]


class LineProblemSerializer(serializers.Serializer):
    line_number = serializers.IntegerField()
    message = serializers.CharField()


class ThreadImportInputSerializer(serializers.Serializer):
    file = serializers.FileField(
        help_text="A session file of Claude Code, Codex, Gemini CLI or pi, or an OpenCode "
        "session as `opencode export <session id>` prints it."
    )


class ThreadImportOutputSerializer(serializers.Serializer):
    outcome = serializers.ChoiceField(choices=["new", "updated", "unchanged"])
    thread = ThreadDetailSerializer()
    lines_skipped = LineProblemSerializer(many=True)


class QuestionChoiceSerializer(serializers.Serializer):
    """A commit question's choice has commit, subject and committed_at; a repository
    question's has repository and reason (why it is offered)."""

    commit = serializers.CharField(required=False)
    subject = serializers.CharField(required=False)
    committed_at = serializers.DateTimeField(required=False)
    repository = serializers.CharField(required=False, help_text="A clone of the repository.")
    reason = serializers.CharField(required=False, help_text="Why this clone is offered.")


class QuestionSerializer(serializers.Serializer):
    thread_id = serializers.IntegerField()
    field = serializers.CharField(help_text="The configuration key that answers the question.")
    message = serializers.CharField()
    choices = QuestionChoiceSerializer(many=True)


class ContextChoiceSerializer(serializers.Serializer):
    mode = serializers.ChoiceField(choices=["cold", "digest", "fork"])
    reason = serializers.CharField(help_text="Why: `chosen`, or how the default was decided.")


class PreparationSerializer(serializers.Serializer):
    thread_id = serializers.IntegerField()
    repository = serializers.CharField(allow_blank=True)
    baseline_commit = serializers.CharField(allow_blank=True)
    ending_commit = serializers.CharField(allow_blank=True)
    historical_result_sha256 = serializers.CharField(allow_blank=True)
    prepared_configuration_sha256 = serializers.DictField(child=serializers.CharField())
    start_message_uuid = serializers.CharField(allow_blank=True)
    end_message_uuid = serializers.CharField(allow_blank=True)
    blockers = serializers.ListField(child=serializers.CharField())
    questions = QuestionSerializer(many=True)
    context = serializers.DictField(
        child=ContextChoiceSerializer(),
        required=False,
        help_text="What each model knows before the range's first request, by model id.",
    )


# Text that is not only spaces (the server strips what it is given).
NOT_BLANK = RegexValidator(r"\S")
# A commit id or the start of one (hexadecimal); blank means "resolve it".
COMMIT_ID = RegexValidator(r"^\s*[0-9a-fA-F]*\s*$")


def _text(max_length: int, **kwargs: Any) -> serializers.CharField:
    """An optional text of the configuration: null or blank means "not given"."""
    kwargs.setdefault("allow_blank", True)
    return serializers.CharField(required=False, allow_null=True, max_length=max_length, **kwargs)


class ThreadConfigurationSerializer(serializers.Serializer):
    """Documentation only, like RunConfigSerializer."""

    thread_id = serializers.IntegerField(min_value=1, max_value=planning.MAX_ID)
    start_message_uuid = _text(200)
    end_message_uuid = _text(200)
    request = _text(planning.MAX_REQUEST_BYTES, help_text="Up to 1 MiB (in UTF-8; 413 beyond).")
    repository = _text(planning.MAX_PATH_LENGTH)
    # Blank is allowed by the pattern (allow_blank would make it a oneOf both branches match).
    baseline_commit = _text(64, validators=[COMMIT_ID], allow_blank=False)
    ending_commit = _text(64, validators=[COMMIT_ID], allow_blank=False)
    thread_title = _text(planning.MAX_TITLE_LENGTH)


class RunConfigSerializer(serializers.Serializer):
    """Documentation only: the body is validated by replays.planning (which also refuses
    control characters, unknown fields and a thread or model given twice)."""

    configurations = serializers.ListField(
        child=ThreadConfigurationSerializer(), min_length=1, max_length=MAX_THREADS_PER_PLAN
    )
    models = serializers.ListField(
        child=serializers.CharField(
            min_length=1, max_length=MODEL_ID_LENGTH, validators=[NOT_BLANK]
        ),
        min_length=1,
        max_length=MAX_MODELS_PER_PLAN,
        help_text="Model ids (GET /api/models/).",
    )
    timeout_seconds = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=planning.MIN_TIMEOUT_SECONDS,
        max_value=planning.MAX_TIMEOUT_SECONDS,
        help_text="Null: REPLAYS_DEFAULT_TIMEOUT_SECONDS.",
    )
    verify_command = _text(
        planning.MAX_VERIFY_COMMAND_LENGTH,
        help_text="argv (no shell); {junit_xml} is replaced by a path for JUnit XML.",
    )
    evaluator = _text(MODEL_ID_LENGTH, help_text="`tests` or a model id (GET /api/evaluators/).")
    test_paths = serializers.ListField(
        child=serializers.CharField(
            max_length=planning.MAX_TEST_PATH_LENGTH,
            # Not blank, not absolute (the server strips the spaces around it).
            validators=[RegexValidator(r"^\s*[^/\s]")],
        ),
        required=False,
        allow_null=True,
        max_length=planning.MAX_TEST_PATHS,
        help_text="Relative globs of the historical diff's test files (default: test_*.py, "
        "*_test.py, tests/**, *.test.*, *_spec.*).",
    )
    context = serializers.JSONField(
        required=False,
        allow_null=True,
        help_text="What the agent knows before the request: `cold` (the request alone), "
        "`digest` (the earlier requests and answers first) or `fork` (the historical "
        "session, resumed), for every model, or {model id: mode} for some. Absent or null: "
        "cold for a thread's first request; later, fork when the model's agent is the "
        "thread's own tool, else digest.",
    )


class ApprovalPromptSerializer(serializers.Serializer):
    required = serializers.BooleanField()
    prompt = serializers.CharField(allow_null=True)
    prepare_token = serializers.CharField(
        allow_null=True, help_text="Shown once, only when the plan is ready for approval."
    )


class PlanSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    status = serializers.CharField()
    ready = serializers.BooleanField()
    evaluator = serializers.CharField(
        allow_blank=True, help_text="Judges every run: named, or resolved at prepare."
    )
    warnings = serializers.ListField(child=serializers.CharField())
    blockers = serializers.ListField(child=serializers.CharField())
    questions = QuestionSerializer(many=True)
    preparations = PreparationSerializer(many=True)
    run_config = RunConfigSerializer()
    approval = ApprovalPromptSerializer()
    expires_at = serializers.DateTimeField()
    batch = serializers.IntegerField(allow_null=True)


class ApproveInputSerializer(serializers.Serializer):
    """Documentation only: replays.approval checks the approval."""

    approved = serializers.ChoiceField(
        choices=[True], help_text="Must be true: nothing runs without it."
    )
    prepare_token = serializers.CharField(help_text="The token prepare returned.")
    run_config = RunConfigSerializer(help_text="The run_config prepare returned, unchanged.")


class ThreadRefSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    title = serializers.CharField()


class ReportSummarySerializer(serializers.Serializer):
    """A run's current report in brief (the whole report: GET /api/runs/{id}/report)."""

    id = serializers.IntegerField()
    status = serializers.CharField(help_text="judged or review_failed.")
    winner = serializers.CharField(
        allow_null=True, help_text="historical, replay or tie; null when not judged."
    )
    score_historical = serializers.FloatField(allow_null=True)
    score_replay = serializers.FloatField(allow_null=True)
    consistent = serializers.BooleanField(
        allow_null=True, help_text="Both orders agreed; null for the tests evaluator."
    )
    evaluator = serializers.CharField()
    reason = serializers.CharField(help_text="Why the review failed.")


class ReportSerializer(serializers.Serializer):
    """One judgment of a run: the columns, and the versioned document (docs/reports.md)."""

    id = serializers.IntegerField()
    run = serializers.IntegerField(source="run_id")
    status = serializers.CharField()
    current = serializers.BooleanField(source="is_current")
    winner = serializers.CharField(allow_null=True)
    score_historical = serializers.FloatField(allow_null=True)
    score_replay = serializers.FloatField(allow_null=True)
    consistent = serializers.BooleanField(allow_null=True)
    evaluator = serializers.CharField()
    prompt_version = serializers.CharField()
    context = serializers.CharField()
    evaluator_cost_usd = cost_field()
    evaluator_seconds = serializers.FloatField(allow_null=True)
    reason = serializers.CharField()
    review = serializers.IntegerField(source="review_id", allow_null=True)
    created_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)
    data = serializers.JSONField(help_text="The report document (schema 1, docs/reports.md).")


class JudgeInputSerializer(serializers.Serializer):
    approved = serializers.BooleanField(
        required=False, help_text="Required (true) for a model evaluator: it costs money."
    )
    evaluator = serializers.CharField(
        required=False, help_text="`tests` or a model id; default: the batch's evaluator."
    )


class EvaluatorSerializer(serializers.Serializer):
    id = serializers.CharField()
    label = serializers.CharField()
    kind = serializers.CharField(help_text="tests, codex, claude_code or command.")
    available = serializers.BooleanField()
    reason = serializers.CharField(allow_blank=True)


class RunSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    batch = serializers.IntegerField(source="batch_id")
    thread = ThreadRefSerializer()
    model = serializers.CharField()
    status = serializers.CharField()
    phase = serializers.CharField()
    host = serializers.CharField()
    created_at = serializers.DateTimeField()
    claimed_at = serializers.DateTimeField(allow_null=True)
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    cancel_requested_at = serializers.DateTimeField(allow_null=True)
    wall_seconds = serializers.FloatField(allow_null=True)
    model_seconds = serializers.FloatField(allow_null=True)
    exit_code = serializers.IntegerField(allow_null=True)
    failure_code = serializers.CharField()
    failure_message = serializers.CharField()
    files_changed = serializers.IntegerField()
    tokens = TokensSerializer(source="*")
    cost_usd = cost_field()
    report = ReportSummarySerializer(
        source="current_report", allow_null=True, help_text="The current report, in brief."
    )


def _spec_field(annotation: str, doc: str) -> serializers.Field:
    """A DRF field for one RunSpec field, from its annotation and description."""
    kinds: dict[str, serializers.Field] = {
        "int": serializers.IntegerField(help_text=doc),
        "int | None": serializers.IntegerField(allow_null=True, help_text=doc),
        "str": serializers.CharField(allow_blank=True, help_text=doc),
        "tuple[str, ...]": serializers.ListField(child=serializers.CharField(), help_text=doc),
        "Mapping[str, Any]": serializers.DictField(help_text=doc),
    }
    return kinds[annotation]


class _SpecAsStored(serializers.Serializer):
    def to_representation(self, instance: runspec.RunSpec) -> dict[str, Any]:
        return instance.as_json()  # as stored and written into the run's folder


# The approved configuration as the API gives it, described from RunSpec itself.
RunSpecSerializer = type(
    "RunSpecSerializer",
    (_SpecAsStored,),
    {
        "__doc__": "The exact configuration the member was approved with (replays.runspec).",
        **{name: _spec_field(str(kind), doc) for name, kind, doc in runspec.documented_fields()},
        # Stored as null when the plan has no verify command.
        "verify_command": serializers.CharField(allow_null=True, allow_blank=True),
    },
)


class RunDetailSerializer(RunSerializer):
    configuration = RunSpecSerializer(
        source="spec", help_text="The exact configuration the member was approved with."
    )
    log_tail = serializers.CharField()
    tree_tests = serializers.JSONField(
        allow_null=True, help_text="The verify command's outcome on the run's tree."
    )
    turns = serializers.JSONField(
        help_text="One entry per request of the range (each its own turn): turn, ending, "
        "exit_code, seconds, model_seconds, cost_usd, tokens, session_id, and with several "
        "turns files_changed and the tree's diff after it."
    )


class LaunchErrorSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    run = serializers.IntegerField(source="run_id")
    code = serializers.CharField()
    message = serializers.CharField()
    host = serializers.CharField()
    created_at = serializers.DateTimeField()


class BatchSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    plan = serializers.IntegerField(source="plan_id")
    models = serializers.ListField(source="models_list", child=serializers.CharField())
    thread_count = serializers.IntegerField()
    evaluator = serializers.CharField(help_text="Judges every run of the batch.")
    approved_at = serializers.DateTimeField()
    finished = serializers.BooleanField(help_text="Every run has ended.")
    results_ready = serializers.BooleanField(
        help_text="Every run ended and every completed run has its report."
    )
    runs = RunSerializer(many=True, source="runs_with_reports")
    launch_errors = LaunchErrorSerializer(many=True)


class ApprovalSerializer(serializers.Serializer):
    batch = BatchSerializer()
    runs = RunSerializer(many=True)
    launch_errors = LaunchErrorSerializer(many=True)
    idempotent = serializers.BooleanField()


class ModelInfoSerializer(serializers.Serializer):
    id = serializers.CharField()
    label = serializers.CharField()
    agent = serializers.CharField()
    available = serializers.BooleanField()
    reason = serializers.CharField(allow_blank=True)
    version = serializers.CharField(allow_blank=True, help_text="The installed agent's version.")
    login = serializers.ChoiceField(
        choices=["ready", "missing", "unknown"],
        help_text="Whether its runs will have a login (a run's agent gets a home of its own "
        "with only its seed files): missing means certainly none, and the run would fail "
        "as a setup problem.",
    )
    login_message = serializers.CharField(
        allow_blank=True, help_text="What gives it its login, or what is missing and the fix."
    )


# --- Leaderboard and exports -----------------------------------------------------------------


class LeaderboardRowSerializer(serializers.Serializer):
    """One model's figures under one evaluator and prompt version (docs/evaluation.md)."""

    model = serializers.CharField()
    baseline = serializers.BooleanField(
        help_text="A calibration baseline (historical, empty): it calibrates the judge."
    )
    n = serializers.IntegerField(help_text="wins + ties + losses + failed.")
    wins = serializers.IntegerField(help_text="Judged better than history.")
    ties = serializers.IntegerField()
    losses = serializers.IntegerField(help_text="Judged worse than history.")
    failed = serializers.IntegerField(
        help_text="The model's own failures (agent errors, timeouts): they count against it."
    )
    setup = serializers.IntegerField(
        help_text="Not in n: failed for setup (not logged in, credentials, quota or rate "
        "limit, a model id the provider does not know, the program missing, the network)."
    )
    not_counted = serializers.IntegerField(
        help_text="Not in n: review failed, cancelled, our infrastructure failed (a launch "
        "that never happened, a lost coordinator), or no report yet."
    )
    rate = serializers.FloatField(
        allow_null=True, help_text="As good as history: (wins + ties) / n; null when n is 0."
    )
    rate_low = serializers.FloatField(allow_null=True, help_text="Wilson 95% interval, low.")
    rate_high = serializers.FloatField(allow_null=True, help_text="Wilson 95% interval, high.")
    mean_score = serializers.FloatField(
        allow_null=True, help_text="Mean replay score over the judged runs."
    )
    total_cost_usd = cost_field()
    median_cost_usd = cost_field()
    median_seconds = serializers.FloatField(allow_null=True, help_text="Median wall time.")
    cost_per_win_usd = cost_field()
    consistency = serializers.FloatField(
        allow_null=True,
        help_text="Share of the judgments whose two orders agreed; null when none was "
        "judged in both orders (the tests evaluator).",
    )


class FilterChoiceSerializer(serializers.Serializer):
    value = serializers.CharField(allow_blank=True)
    count = serializers.IntegerField()


class LeaderboardChoicesSerializer(serializers.Serializer):
    evaluator = FilterChoiceSerializer(
        many=True, source="evaluators", help_text="With their counts of current judged reports."
    )
    prompt_version = FilterChoiceSerializer(many=True, source="prompt_versions")
    context = FilterChoiceSerializer(many=True, source="contexts")
    repository = FilterChoiceSerializer(
        many=True, source="repositories", help_text="With their counts of runs."
    )
    agent = FilterChoiceSerializer(many=True, source="agents")


class LeaderboardFiltersSerializer(serializers.Serializer):
    evaluator = serializers.CharField(
        allow_null=True, help_text="The evaluator the figures are for: given, or the most used."
    )
    prompt_version = serializers.CharField(allow_null=True)
    filters = serializers.DictField(
        child=serializers.CharField(), source="filters.as_params", help_text="The filters set."
    )
    available = LeaderboardChoicesSerializer(source="choices")


class BatchResultSerializer(serializers.Serializer):
    """One run of a batch with its current report (empty report fields without one)."""

    run = serializers.IntegerField()
    thread = serializers.IntegerField()
    thread_title = serializers.CharField()
    model = serializers.CharField()
    status = serializers.CharField()
    failure_code = serializers.CharField(allow_blank=True)
    winner = serializers.CharField(allow_null=True)
    consistent = serializers.BooleanField(allow_null=True)
    score_historical = serializers.FloatField(allow_null=True)
    score_replay = serializers.FloatField(allow_null=True)
    tests_kept = serializers.IntegerField(
        allow_null=True, help_text="Reference tests the replay keeps; null without tests."
    )
    tests_broken = serializers.IntegerField(allow_null=True)
    replay_cost_usd = cost_field()
    historical_cost_usd = cost_field()
    replay_seconds = serializers.FloatField(allow_null=True)
    historical_seconds = serializers.FloatField(allow_null=True)
    evaluator = serializers.CharField(allow_null=True)
    evaluator_cost_usd = cost_field()
    report_status = serializers.CharField(
        allow_null=True, help_text="judged or review_failed; null without a report."
    )


# --- Errors ----------------------------------------------------------------------------------


class ErrorBodySerializer(serializers.Serializer):
    code = serializers.CharField(help_text="What went wrong, for programs: `not_found`, ...")
    message = serializers.CharField(help_text="What went wrong, for people.")
    details = serializers.JSONField(
        allow_null=True, help_text="More about it (the fields concerned, limits), or null."
    )


class ErrorSerializer(serializers.Serializer):
    """Every error of the API, whatever its status."""

    error = ErrorBodySerializer()
