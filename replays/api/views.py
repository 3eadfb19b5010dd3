from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.http import HttpResponse
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import generics, status
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import BaseSerializer
from rest_framework.views import APIView

from replays import agents, approval, dispatch, importing, planning, runlogs
from replays.api.errors import ApiError
from replays.api.renderers import ExportMixin
from replays.api.serializers import (
    ApprovalSerializer,
    ApproveInputSerializer,
    BatchResultSerializer,
    BatchSerializer,
    ErrorSerializer,
    EvaluatorSerializer,
    JudgeInputSerializer,
    LeaderboardFiltersSerializer,
    LeaderboardRowSerializer,
    ModelInfoSerializer,
    PlanSerializer,
    ReportSerializer,
    RunConfigSerializer,
    RunDetailSerializer,
    ThreadDetailSerializer,
    ThreadImportInputSerializer,
    ThreadImportOutputSerializer,
    ThreadSerializer,
)
from replays.api.throttling import WRITE_SCOPE
from replays.evaluation import evaluators, results
from replays.evaluation import leaderboard as leaderboards
from replays.evaluation import report as reports
from replays.models import Batch, Plan, PlanStatus, Run, Thread

# As on the thread list page: a longer search is cut, not refused.
MAX_SEARCH_LENGTH = 200

# --- Errors, as the schema declares them --------------------------------------------------------

_AUTH_ERRORS = {
    401: "No credentials, or a token that is not valid.",
    403: "Not allowed (a session without its CSRF token).",
}
_WRITE_ERRORS = {
    413: "The request body is larger than 2 MiB.",
    429: "More writes than REPLAYS_API_WRITE_RATE allows: wait Retry-After seconds.",
}
_JSON_BODY_ERRORS = {
    400: "Not valid: not a JSON object, an unknown field, a value out of bounds.",
    415: "The body is not JSON.",
}
RETRY_AFTER = OpenApiParameter(
    "Retry-After",
    int,
    location=OpenApiParameter.HEADER,
    response=[429],
    description="Seconds until the next write is allowed.",
)


def error_responses(
    described: dict[int, str] | None = None, *, write: bool = False
) -> dict[int, OpenApiResponse]:
    """The errors an operation answers (every operation needs a login; a write has its
    limits), each in the one error shape."""
    codes = {**_AUTH_ERRORS, **(_WRITE_ERRORS if write else {}), **(described or {})}
    return {
        code: OpenApiResponse(ErrorSerializer, description=codes[code]) for code in sorted(codes)
    }


def write_schema(
    request: Any,
    responses: dict[int, Any],
    errors: dict[int, str],
    *,
    json_body: bool = True,
    **kwargs: Any,
) -> Any:
    """extend_schema for a write: its answers, its own errors, a JSON body's (400, 415) when
    it reads one, and every write's (413, and 429 with Retry-After)."""
    described = {**(_JSON_BODY_ERRORS if json_body else {}), **errors}
    return extend_schema(
        request=request,
        parameters=[RETRY_AFTER],
        responses={**responses, **error_responses(described, write=True)},
        **kwargs,
    )


def json_object(request: Request, fields: set[str]) -> dict[str, Any]:
    """The body: a JSON object with no other keys than `fields` (prepare refuses unknown
    fields as well, in replays.planning)."""
    data = request.data
    if not isinstance(data, dict):
        raise ApiError(code="invalid", message="The body must be a JSON object.")
    unknown = sorted(set(data) - fields)
    if unknown:
        raise ApiError(
            code="invalid",
            message=f"Unknown fields: {', '.join(unknown)}.",
            details={"fields": unknown},
        )
    return data


# --- Threads ----------------------------------------------------------------------------------


class ThreadListView(generics.ListAPIView):
    serializer_class = ThreadSerializer

    def get_queryset(self) -> QuerySet[Thread]:
        search = self.request.query_params.get("search", "").strip()[:MAX_SEARCH_LENGTH]
        threads = Thread.objects.visible_to(self.request.user)
        if "\x00" in search:
            # No stored text holds a NUL (PostgreSQL cannot even be asked about one).
            return threads.none()
        return threads.search(search)

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "search",
                str,
                description="Text in the title, folder or a request (its first "
                f"{MAX_SEARCH_LENGTH} characters).",
            )
        ],
        responses={
            200: ThreadSerializer(many=True),
            **error_responses({404: "No such page."}),
        },
    )
    def get(self, request: Request, *args: object, **kwargs: object) -> Response:
        return super().get(request, *args, **kwargs)


class ThreadDetailView(generics.RetrieveAPIView):
    serializer_class = ThreadDetailSerializer

    def get_queryset(self) -> QuerySet[Thread]:
        return Thread.objects.visible_to(self.request.user).prefetch_related("turns")

    @extend_schema(
        responses={200: ThreadDetailSerializer, **error_responses({404: "No such thread."})}
    )
    def get(self, request: Request, *args: object, **kwargs: object) -> Response:
        return super().get(request, *args, **kwargs)


class ThreadImportView(APIView):
    parser_classes = [MultiPartParser]
    throttle_scope = WRITE_SCOPE

    @write_schema(
        {"multipart/form-data": ThreadImportInputSerializer},
        {
            201: OpenApiResponse(
                ThreadImportOutputSerializer, description="New or changed thread."
            ),
            200: OpenApiResponse(
                ThreadImportOutputSerializer, description="Unchanged: nothing written."
            ),
        },
        {
            400: "Not a transcript, or no file.",
            413: "Larger than the transcript limit.",
            415: "Not multipart/form-data.",
        },
        json_body=False,
    )
    def post(self, request: Request) -> Response:
        given = ThreadImportInputSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        upload = given.validated_data["file"]
        limit = importing.max_transcript_bytes()
        if upload.size > limit:
            raise ApiError(
                code="too_large",
                status_code=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
                message=f"{upload.name}: the file is larger than the transcript limit of "
                f"{limit / (1024 * 1024):.1f} MiB.",
                details={"size": upload.size, "limit": limit},
            )
        result = importing.import_uploaded_transcript(
            upload=upload, filename=upload.name, user=request.user
        )
        if result.outcome == "failed":
            raise ApiError(code="not_a_transcript", message=result.error)
        thread = Thread.objects.prefetch_related("turns").get(pk=result.thread.pk)
        body = ThreadImportOutputSerializer(
            {"outcome": result.outcome, "thread": thread, "lines_skipped": result.problems},
            context={"request": request},
        ).data
        code = status.HTTP_200_OK if result.outcome == "unchanged" else status.HTTP_201_CREATED
        return Response(body, status=code)


# --- Plans, batches, runs ------------------------------------------------------------------


def _plan_body(plan: Plan, *, prepare_token: str | None = None) -> dict[str, object]:
    ready = plan.status == PlanStatus.READY_FOR_APPROVAL
    batch = plan.batch
    return {
        "id": plan.pk,
        "status": plan.status,
        "ready": ready,
        "evaluator": plan.evaluator,
        "warnings": plan.warnings,
        "blockers": plan.blockers,
        "questions": plan.questions,
        "preparations": plan.preparations,
        "run_config": plan.configuration,
        "approval": {
            "required": True,
            "prompt": plan.approval_prompt or None,
            "prepare_token": prepare_token,
        },
        "expires_at": plan.expires_at,
        "batch": batch.pk if batch else None,
    }


class PlanCreateView(APIView):
    throttle_scope = WRITE_SCOPE

    @write_schema(
        RunConfigSerializer,
        {201: PlanSerializer},
        {
            409: "Models of one thread saw different baselines or historical results.",
            413: "The request body is larger than 2 MiB, or a request larger than 1 MiB.",
        },
    )
    def post(self, request: Request) -> Response:
        # A refusal (ServiceError) is answered by the exception handler.
        prepared = planning.prepare_plan(owner=request.user, raw_configuration=request.data)
        body = _plan_body(prepared.plan, prepare_token=prepared.prepare_token)
        return Response(PlanSerializer(body).data, status=status.HTTP_201_CREATED)


class PlanDetailView(APIView):
    @extend_schema(responses={200: PlanSerializer, **error_responses({404: "No such plan."})})
    def get(self, request: Request, pk: int) -> Response:
        plan = get_object_or_404(Plan.objects.visible_to(request.user), pk=pk)
        return Response(PlanSerializer(_plan_body(plan)).data)


def approval_body(result: approval.ApprovalResult) -> dict[str, object]:
    return ApprovalSerializer(
        {
            "batch": result.batch,
            "runs": result.runs,
            "launch_errors": result.launch_errors,
            "idempotent": result.idempotent,
        }
    ).data


class PlanApproveView(APIView):
    throttle_scope = WRITE_SCOPE

    @write_schema(
        ApproveInputSerializer,
        {201: ApprovalSerializer, 200: ApprovalSerializer},
        {
            400: "No approval (approved must be true), no token, or not valid.",
            403: "An unknown token, or another plan's.",
            404: "No such plan.",
            409: "The configuration or its inputs changed, or the plan is not ready.",
            410: "The prepare token expired.",
        },
        description="First approval: 201 with the new batch. The same approval again: 200 with "
        "the same batch and idempotent=true.",
    )
    def post(self, request: Request, pk: int) -> Response:
        data = json_object(request, {"approved", "prepare_token", "run_config"})
        result = approval.approve_plan(
            plan_id=pk,
            user=request.user,
            approved=data.get("approved"),
            prepare_token=data.get("prepare_token"),
            run_config=data.get("run_config"),
        )
        code = status.HTTP_200_OK if result.idempotent else status.HTTP_201_CREATED
        return Response(approval_body(result), status=code)


class BatchDetailView(APIView):
    @extend_schema(responses={200: BatchSerializer, **error_responses({404: "No such batch."})})
    def get(self, request: Request, pk: int) -> Response:
        batch = get_object_or_404(Batch.objects.visible_to(request.user), pk=pk)
        return Response(BatchSerializer(batch).data)


class BatchCancelView(APIView):
    throttle_scope = WRITE_SCOPE

    @write_schema(None, {200: BatchSerializer}, {404: "No such batch."}, json_body=False)
    def post(self, request: Request, pk: int) -> Response:
        batch = get_object_or_404(Batch.objects.visible_to(request.user), pk=pk)
        batch = dispatch.cancel_batch(batch=batch)
        return Response(BatchSerializer(batch).data)


def _visible_run(request: Request, pk: int) -> Run:
    return get_object_or_404(
        Run.objects.visible_to(request.user).select_related("thread", "batch"), pk=pk
    )


class RunDetailView(APIView):
    @extend_schema(responses={200: RunDetailSerializer, **error_responses({404: "No such run."})})
    def get(self, request: Request, pk: int) -> Response:
        return Response(RunDetailSerializer(_visible_run(request, pk)).data)


class RunReportView(APIView):
    @extend_schema(
        responses={
            200: ReportSerializer,
            **error_responses({404: "No such run, or no report yet."}),
        },
        description="The run's current report: the latest finished judgment.",
    )
    def get(self, request: Request, pk: int) -> Response:
        run = _visible_run(request, pk)
        current = run.current_report
        if current is None:
            raise ApiError(
                code="no_report",
                status_code=status.HTTP_404_NOT_FOUND,
                message=f"Run {run.pk} has no report yet.",
                details={"run": run.pk, "status": run.status, "phase": run.phase},
            )
        return Response(ReportSerializer(current).data)


class RunJudgeView(APIView):
    throttle_scope = WRITE_SCOPE

    @write_schema(
        JudgeInputSerializer,
        {202: ReportSerializer},
        {
            400: "No approval for a model evaluator, an unknown evaluator, or not valid.",
            404: "No such run.",
            409: "Not completed, the evaluator cannot judge here, or a judgment is in progress.",
        },
        description="Judge a completed run again (its agent does not run again) in its own "
        "process; the judging report comes back at once, the current one stays until it ends.",
    )
    def post(self, request: Request, pk: int) -> Response:
        run = _visible_run(request, pk)
        data = json_object(request, {"approved", "evaluator"})
        evaluator = data.get("evaluator")
        if evaluator is not None and not isinstance(evaluator, str):
            raise ApiError(code="invalid", message="evaluator must be a string.")
        judging = reports.request_judgment(
            run=run, evaluator=evaluator, approved=data.get("approved"), user=request.user
        )
        return Response(ReportSerializer(judging).data, status=status.HTTP_202_ACCEPTED)


class RunCancelView(APIView):
    throttle_scope = WRITE_SCOPE

    @write_schema(None, {200: RunDetailSerializer}, {404: "No such run."}, json_body=False)
    def post(self, request: Request, pk: int) -> Response:
        run = dispatch.cancel_run(run=_visible_run(request, pk))
        return Response(RunDetailSerializer(run).data)


class RunDiffView(APIView):
    @extend_schema(
        responses={
            (200, "text/plain"): OpenApiResponse(
                str, description="Unified diff against the baseline."
            ),
            **error_responses({404: "No such run."}),
        }
    )
    def get(self, request: Request, pk: int) -> HttpResponse:
        run = _visible_run(request, pk)
        response = HttpResponse(run.diff, content_type="text/plain; charset=utf-8")
        response["Content-Disposition"] = f'inline; filename="run-{run.pk}.diff"'
        return response


class RunLogView(APIView):
    @extend_schema(
        responses={
            (200, "text/plain"): OpenApiResponse(
                str, description="The run's whole agent log (a very long one: its end)."
            ),
            **error_responses({404: "No such run, or it has no log."}),
        }
    )
    def get(self, request: Request, pk: int) -> HttpResponse:
        run = _visible_run(request, pk)
        text = runlogs.log_text(run)
        if text is None:
            raise ApiError(code="no_log", message="This run has no log.", status_code=404)
        response = HttpResponse(text, content_type="text/plain; charset=utf-8")
        response["Content-Disposition"] = f'inline; filename="run-{run.pk}.log"'
        return response


class ModelListView(APIView):
    @extend_schema(responses={200: ModelInfoSerializer(many=True), **error_responses()})
    def get(self, request: Request) -> Response:
        return Response(ModelInfoSerializer(agents.discover_models(), many=True).data)


class EvaluatorListView(APIView):
    @extend_schema(responses={200: EvaluatorSerializer(many=True), **error_responses()})
    def get(self, request: Request) -> Response:
        return Response(EvaluatorSerializer(evaluators.discover_evaluators(), many=True).data)


# --- Leaderboard and exports -----------------------------------------------------------------

_FILTER_PARAMETERS = [
    OpenApiParameter("repository", str, description="The repository path the runs replayed in."),
    OpenApiParameter(
        "agent",
        str,
        description="The part of the model id before ':'; `baseline` for the baselines.",
    ),
    OpenApiParameter(
        "evaluator", str, description="Whose judgments count (default: the most used)."
    ),
    OpenApiParameter(
        "prompt_version",
        str,
        description="Which prompt version's judgments count (default: the most used).",
    ),
    OpenApiParameter("context", str, description="The context the replays ran with (`cold`)."),
    OpenApiParameter(
        "since", OpenApiTypes.DATE, description="Runs created on or after this day (UTC)."
    ),
    OpenApiParameter(
        "until", OpenApiTypes.DATE, description="Runs created on or before this day (UTC)."
    ),
]
_FORMAT_PARAMETER = OpenApiParameter(
    "format", str, enum=["json", "csv"], description="json (the default) or csv."
)
_FIGURES_HEADERS = [
    OpenApiParameter(
        name,
        str,
        location=OpenApiParameter.HEADER,
        response=[200],
        description=f"The {what} the figures are for (empty when nothing was judged).",
    )
    for name, what in (
        ("X-Replays-Evaluator", "evaluator"),
        ("X-Replays-Prompt-Version", "prompt version"),
    )
]


def _export_responses(
    rows: BaseSerializer, errors: dict[int, OpenApiResponse]
) -> dict[int | tuple[int, str], BaseSerializer | OpenApiResponse]:
    """The rows as JSON, or as CSV with one column per field (`?format=csv`)."""
    return {
        (200, "application/json"): rows,
        (200, "text/csv"): OpenApiResponse(
            OpenApiTypes.STR, description="A header line, then one line per row."
        ),
        **errors,
    }


def _leaderboard(request: Request, *, with_choices: bool) -> leaderboards.Leaderboard:
    filters = leaderboards.parse_filters(request.query_params)
    return leaderboards.leaderboard(user=request.user, filters=filters, with_choices=with_choices)


class LeaderboardView(ExportMixin, APIView):
    csv_columns = list(LeaderboardRowSerializer().fields)

    def export_filename(self) -> str:
        return "leaderboard"

    @extend_schema(
        parameters=[*_FILTER_PARAMETERS, _FORMAT_PARAMETER, *_FIGURES_HEADERS],
        responses=_export_responses(
            LeaderboardRowSerializer(many=True),
            error_responses(
                {400: "A filter value that cannot be used.", 404: "An unknown format."}
            ),
        ),
        description="Per model, over your runs (staff: everyone's), sorted by the lower bound "
        "of the rate's Wilson 95% interval. The figures are for one evaluator and one prompt "
        "version, named in the X-Replays-Evaluator and X-Replays-Prompt-Version headers; "
        "GET /api/leaderboard/filters lists the values each filter can take.",
    )
    def get(self, request: Request) -> Response:
        board = _leaderboard(request, with_choices=False)
        response = Response(LeaderboardRowSerializer(board.rows, many=True).data)
        response["X-Replays-Evaluator"] = board.evaluator or ""
        response["X-Replays-Prompt-Version"] = board.prompt_version or ""
        return response


class LeaderboardFiltersView(APIView):
    @extend_schema(
        parameters=_FILTER_PARAMETERS,
        responses={
            200: LeaderboardFiltersSerializer,
            **error_responses({400: "A filter value that cannot be used."}),
        },
        description="Which evaluator and prompt version the leaderboard's figures are for with "
        "these filters, and the values each filter can take among your runs.",
    )
    def get(self, request: Request) -> Response:
        return Response(LeaderboardFiltersSerializer(_leaderboard(request, with_choices=True)).data)


class BatchResultsView(ExportMixin, APIView):
    csv_columns = list(BatchResultSerializer().fields)

    def export_filename(self) -> str:
        return f"batch-{self.kwargs['pk']}-results"  # type: ignore[attr-defined]

    @extend_schema(
        parameters=[_FORMAT_PARAMETER],
        responses=_export_responses(
            BatchResultSerializer(many=True),
            error_responses({404: "No such batch, or not yours; or an unknown format."}),
        ),
        description="One row per run of the batch, with its current report.",
    )
    def get(self, request: Request, pk: int) -> Response:
        batch = get_object_or_404(Batch.objects.visible_to(request.user), pk=pk)
        rows = results.batch_results(batch=batch)
        return Response(BatchResultSerializer(rows, many=True).data)
