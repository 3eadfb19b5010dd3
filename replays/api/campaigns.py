"""The campaigns' REST door (docs/campaigns.md): prepare, approve, read, results, cancel.
Thin: replays.campaigns decides, replays.budgets counts the money,
replays.evaluation.campaign_results keeps the results."""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.renderers import BrowsableAPIRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from replays import budgets, campaigns
from replays.api.renderers import CSVRenderer, ExportMixin
from replays.api.serializers import cost_field
from replays.api.throttling import WRITE_SCOPE
from replays.api.views import error_responses, json_object, write_schema
from replays.evaluation import campaign_results
from replays.models import Campaign, CampaignStatus, ExclusionReason, RunStatus

# --- serializers ---------------------------------------------------------------------------


class FiltersSerializer(serializers.Serializer):
    tool = serializers.CharField(allow_null=True, required=False)
    repository = serializers.CharField(
        allow_null=True, required=False, help_text="Only threads recorded in it or below it."
    )
    folder = serializers.CharField(
        allow_null=True, required=False, help_text="Only threads recorded in it or below it."
    )
    since = serializers.DateField(allow_null=True, required=False)
    until = serializers.DateField(allow_null=True, required=False)
    last = serializers.IntegerField(
        required=False, help_text=f"Scan at most this many requests, newest first "
        f"(default {campaigns.DEFAULT_SCAN}, at most {campaigns.MAX_SCAN})."
    )  # fmt: skip


class CampaignInputSerializer(serializers.Serializer):
    """Documentation only: replays.campaigns.normalise_campaign checks the input."""

    models = serializers.ListField(
        child=serializers.CharField(), help_text="1 to 8 models; historical and empty allowed."
    )
    evaluator = serializers.CharField(required=False, help_text="One evaluator for every run.")
    limit = serializers.IntegerField(
        required=False, help_text=f"Requests to select (default 20, at most {campaigns.MAX_SELECTED})."
    )  # fmt: skip
    selection = serializers.ChoiceField(
        choices=list(campaigns.SELECTIONS), required=False,
        help_text="last: the newest eligible requests (default); sample: a seeded sample.",
    )  # fmt: skip
    seed = serializers.IntegerField(required=False, help_text="The sample's seed.")
    budget_usd = serializers.DecimalField(
        max_digits=14, decimal_places=6, required=False, allow_null=True,
        help_text="Dollars the campaign may spend (runs and judging); none: no budget.",
    )  # fmt: skip
    gradable_only = serializers.BooleanField(
        required=False, help_text="Only requests whose historical tests see their change."
    )
    filters = FiltersSerializer(required=False)
    verify_commands = serializers.DictField(
        child=serializers.CharField(), required=False,
        help_text="{repository: test command}; otherwise the one the historical agent ran.",
    )  # fmt: skip
    clones = serializers.DictField(
        child=serializers.CharField(), required=False,
        help_text="{recorded folder: clone}: where the repository of threads recorded in a "
        "folder that is gone or elsewhere is now (for that folder and below it).",
    )  # fmt: skip
    context = serializers.JSONField(required=False, help_text="Context per model, as for plans.")
    timeout_seconds = serializers.IntegerField(required=False)


class CampaignApproveInputSerializer(serializers.Serializer):
    """Documentation only: replays.campaigns.approve_campaign checks the approval."""

    approved = serializers.ChoiceField(
        choices=[True], help_text="Must be true: nothing runs without it."
    )
    prepare_token = serializers.CharField(help_text="The token prepare returned.")


class CountsSerializer(serializers.Serializer):
    scanned = serializers.IntegerField()
    eligible = serializers.IntegerField()
    gradable = serializers.IntegerField(help_text="Eligible and known to be gradable.")
    gradable_unknown = serializers.IntegerField(
        help_text="Eligible, gradability not known until their tests run."
    )
    excluded = serializers.DictField(
        child=serializers.IntegerField(),
        help_text="Requests excluded, by reason: "
        + ", ".join(str(reason.value) for reason in ExclusionReason if reason.value),
    )
    selected = serializers.IntegerField()


class CandidateSerializer(serializers.Serializer):
    thread_id = serializers.IntegerField()
    start_message_uuid = serializers.CharField(source="message_uuid")
    request = serializers.SerializerMethodField()
    timestamp = serializers.DateTimeField()
    eligible = serializers.BooleanField()
    reason = serializers.CharField(allow_blank=True, help_text="Why it is excluded.")
    detail = serializers.CharField(allow_blank=True)
    gradable = serializers.BooleanField(allow_null=True, help_text="Null: not known.")
    gradable_detail = serializers.CharField(allow_blank=True)
    repository = serializers.CharField(allow_blank=True)
    verify_command = serializers.CharField(allow_blank=True)
    selected = serializers.BooleanField()

    def get_request(self, candidate: Any) -> str:
        return str(candidate.request)[:200]


class ModelEstimateSerializer(serializers.Serializer):
    cost_usd = cost_field()
    seconds = serializers.FloatField()


class EstimateSerializer(serializers.Serializer):
    models = serializers.DictField(child=ModelEstimateSerializer())
    evaluator_cost_usd = cost_field()
    total_cost_usd = cost_field()
    runs = serializers.IntegerField()
    seconds = serializers.FloatField(help_text="At the current capacity.")
    capacity = serializers.IntegerField()


class CampaignApprovalPromptSerializer(serializers.Serializer):
    required = serializers.BooleanField()
    prompt = serializers.CharField(allow_null=True)
    prepare_token = serializers.CharField(
        allow_null=True, help_text="Shown once, by prepare; null afterwards or when blocked."
    )


class CampaignSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    status = serializers.ChoiceField(choices=CampaignStatus.values)
    configuration = serializers.JSONField()
    models = serializers.ListField(child=serializers.CharField())
    evaluator = serializers.CharField(allow_blank=True)
    budget_usd = cost_field()
    counts = CountsSerializer()
    test_commands = serializers.JSONField(
        help_text="{repository: {command, runner, origin: {thread_id, turn, message_uuid, "
        "typed} or {given: true}} or {error}}."
    )
    estimate = EstimateSerializer()
    blockers = serializers.ListField(child=serializers.CharField())
    warnings = serializers.ListField(child=serializers.CharField())
    approval = CampaignApprovalPromptSerializer()
    expires_at = serializers.DateTimeField()
    approved_at = serializers.DateTimeField(allow_null=True)
    members = serializers.DictField(
        child=serializers.IntegerField(), help_text="Member runs by status."
    )
    spent_usd = cost_field()
    in_flight_usd = cost_field()
    waiting_for_budget = serializers.BooleanField()
    batches = serializers.ListField(child=serializers.IntegerField())


class PreparedCampaignSerializer(CampaignSerializer):
    candidates = CandidateSerializer(many=True)


class HeadToHeadSerializer(serializers.Serializer):
    a = serializers.CharField()
    b = serializers.CharField()
    n = serializers.IntegerField()
    wins = serializers.IntegerField(help_text="Requests a did better on.")
    ties = serializers.IntegerField()
    losses = serializers.IntegerField()
    p_value = serializers.FloatField(
        allow_null=True, help_text="Exact two-sided sign test, ties left out."
    )


class CampaignModelRowSerializer(serializers.Serializer):
    model = serializers.CharField()
    baseline = serializers.BooleanField()
    n = serializers.IntegerField(help_text="wins + ties + losses + failed.")
    wins = serializers.IntegerField()
    ties = serializers.IntegerField()
    losses = serializers.IntegerField()
    failed = serializers.IntegerField(help_text="The model's own failures.")
    setup = serializers.IntegerField(help_text="Not in n: setup problems.")
    not_counted = serializers.IntegerField(
        help_text="Not in n: ours (budget exhausted, launch failed...), review failed, "
        "cancelled, not judged yet."
    )
    not_counted_reasons = serializers.DictField(child=serializers.IntegerField())
    rate = serializers.FloatField(allow_null=True, help_text="As good as history.")
    rate_low = serializers.FloatField(allow_null=True, help_text="Wilson 95%, low.")
    rate_high = serializers.FloatField(allow_null=True, help_text="Wilson 95%, high.")
    cost_usd = cost_field()
    history_cost_usd = cost_field()
    cost_ratio_median = serializers.FloatField(
        allow_null=True, help_text="Median over requests of its cost / history's."
    )
    seconds = serializers.FloatField(allow_null=True)
    history_seconds = serializers.FloatField(allow_null=True)
    time_ratio_median = serializers.FloatField(allow_null=True)
    cost_per_success_usd = cost_field()


class CalibrationCheckSerializer(serializers.Serializer):
    model = serializers.CharField()
    expected = serializers.CharField()
    checked = serializers.IntegerField()
    wrong = serializers.IntegerField()
    wrong_runs = serializers.ListField(child=serializers.IntegerField())


class CalibrationSerializer(serializers.Serializer):
    checks = CalibrationCheckSerializer(many=True)
    trusted = serializers.BooleanField(
        allow_null=True, help_text="False: the baselines say the judge is not to be trusted."
    )
    problems = serializers.ListField(child=serializers.CharField())


class ChartPointSerializer(serializers.Serializer):
    model = serializers.CharField()
    rate = serializers.FloatField()
    rate_low = serializers.FloatField()
    rate_high = serializers.FloatField()
    cost_ratio = serializers.FloatField(allow_null=True)
    x = serializers.FloatField(allow_null=True, help_text="0..1 on a log scale, 1/16 to 16.")


class CampaignResultsSerializer(serializers.Serializer):
    campaign = serializers.IntegerField()
    status = serializers.ChoiceField(choices=CampaignStatus.values)
    members = serializers.DictField(child=serializers.IntegerField())
    models = CampaignModelRowSerializer(many=True)
    head_to_head = HeadToHeadSerializer(many=True)
    calibration = CalibrationSerializer()
    requests = serializers.ListField(child=serializers.JSONField())
    chart = ChartPointSerializer(many=True)


# --- bodies -----------------------------------------------------------------------------------


def campaign_body(campaign: Campaign, *, prepare_token: str | None = None) -> dict[str, Any]:
    money = budgets.money_of(campaign)
    members = (campaign.results or {}).get("members") or {}
    if campaign.approved_at is not None and not members:
        members = {RunStatus.QUEUED.value: campaign.estimate.get("runs", 0)}
    return {
        "id": campaign.pk,
        "status": campaign.status,
        "configuration": campaign.configuration,
        "models": campaign.configuration.get("models", []),
        "evaluator": campaign.evaluator,
        "budget_usd": campaign.budget_usd,
        "counts": campaign.counts,
        "test_commands": campaign.test_commands,
        "estimate": campaign.estimate,
        "blockers": campaign.blockers,
        "warnings": campaign.warnings,
        "approval": {
            "required": True,
            "prompt": campaign.approval_prompt or None,
            "prepare_token": prepare_token,
        },
        "expires_at": campaign.expires_at,
        "approved_at": campaign.approved_at,
        "members": members,
        "spent_usd": money.spent,
        "in_flight_usd": money.in_flight,
        "waiting_for_budget": budgets.waiting_for_money(campaign, money),
        "batches": list(campaign.batches.order_by("pk").values_list("pk", flat=True)),
    }


def _visible(request: Request, pk: int) -> Campaign:
    return get_object_or_404(Campaign.objects.visible_to(request.user), pk=pk)


# --- views --------------------------------------------------------------------------------------


class CampaignListView(APIView):
    throttle_scope = WRITE_SCOPE

    @extend_schema(
        responses={200: CampaignSerializer(many=True), **error_responses()},
        description="Your campaigns, newest first (staff: everyone's).",
    )
    def get(self, request: Request) -> Response:
        found = Campaign.objects.visible_to(request.user)[:100]
        return Response(CampaignSerializer([campaign_body(c) for c in found], many=True).data)

    @write_schema(
        CampaignInputSerializer,
        {201: PreparedCampaignSerializer},
        {},
        description="Prepare: scan your own history with the filters, decide every request "
        "(eligible or excluded with one reason), find each repository's test command, select, "
        "estimate. 201 with status ready_for_approval (and the one-time prepare_token) or "
        "blocked (blockers say why). Nothing runs until POST /api/campaigns/{id}/approve.",
    )
    def post(self, request: Request) -> Response:
        prepared = campaigns.prepare_campaign(owner=request.user, raw_configuration=request.data)
        campaign = prepared.campaign
        body = campaign_body(campaign, prepare_token=prepared.prepare_token)
        body["candidates"] = list(campaign.requests.order_by("position"))
        return Response(PreparedCampaignSerializer(body).data, status=status.HTTP_201_CREATED)


class CampaignDetailView(APIView):
    @extend_schema(
        responses={200: CampaignSerializer, **error_responses({404: "No such campaign."})},
        description="status is running until every member ended (and was judged), then "
        "finished; members by status; money spent (and held for what is under way) against "
        "the budget.",
    )
    def get(self, request: Request, pk: int) -> Response:
        campaign = campaign_results.refresh_if_stale(_visible(request, pk))
        return Response(CampaignSerializer(campaign_body(campaign)).data)


class CampaignApproveView(APIView):
    throttle_scope = WRITE_SCOPE

    @write_schema(
        CampaignApproveInputSerializer,
        {201: CampaignSerializer, 200: CampaignSerializer},
        {
            400: "No approval (approved must be true), or no token.",
            403: "An unknown token, or another campaign's.",
            404: "No such campaign.",
            409: "An input changed since prepare (a transcript, a commit, a test command's "
            "files), or the campaign is blocked.",
            410: "The prepare token expired.",
        },
        description="One approval of the whole campaign creates every member (a plan and a "
        "batch per selected request) in one transaction: 201. The same approval again: 200 "
        "with the same campaign.",
    )
    def post(self, request: Request, pk: int) -> Response:
        data = json_object(request, {"approved", "prepare_token"})
        result = campaigns.approve_campaign(
            campaign_id=pk,
            user=request.user,
            approved=data.get("approved"),
            prepare_token=data.get("prepare_token"),
        )
        code = status.HTTP_200_OK if result.idempotent else status.HTTP_201_CREATED
        return Response(CampaignSerializer(campaign_body(result.campaign)).data, status=code)


FORMAT = OpenApiParameter(
    "format", str, enum=["json", "csv"], description="csv: the results as a CSV file."
)


class ResultsCSVRenderer(CSVRenderer):
    """The results (the per-model table, then each request's outcomes) as one CSV file."""

    def render(
        self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None
    ) -> bytes:
        return campaign_results.results_csv(data).encode(self.charset)


class CampaignResultsView(ExportMixin, APIView):
    """Errors stay JSON whatever format was asked for (ExportMixin)."""

    renderer_classes = [JSONRenderer, BrowsableAPIRenderer, ResultsCSVRenderer]

    def export_filename(self) -> str:
        return f"campaign-{self.kwargs['pk']}-results"

    @extend_schema(
        parameters=[FORMAT],
        responses={
            (200, "application/json"): CampaignResultsSerializer,
            (200, "text/csv"): OpenApiResponse(OpenApiTypes.STR),
            **error_responses({404: "No such campaign."}),
        },
        description="Per model: n, wins / ties / losses against history, failures apart by "
        "whose they are, the rate with its Wilson 95% interval, cost and time against history "
        "on the same requests; head to head with the sign test; calibration; every request.",
    )
    def get(self, request: Request, pk: int) -> Response:
        campaign = campaign_results.refresh_if_stale(_visible(request, pk))
        results = campaign.results or {}
        body = {
            "campaign": campaign.pk,
            "status": campaign.status,
            "members": results.get("members") or {},
            "models": results.get("models") or [],
            "head_to_head": results.get("head_to_head") or [],
            "calibration": results.get("calibration")
            or {"checks": [], "trusted": None, "problems": []},
            "requests": results.get("requests") or [],
            "chart": results.get("chart") or [],
        }
        return Response(CampaignResultsSerializer(body).data)


class CampaignCancelView(APIView):
    throttle_scope = WRITE_SCOPE

    @write_schema(None, {200: CampaignSerializer}, {404: "No such campaign."}, json_body=False)
    def post(self, request: Request, pk: int) -> Response:
        campaign = campaigns.cancel_campaign(campaign=_visible(request, pk))
        return Response(CampaignSerializer(campaign_body(campaign)).data)
