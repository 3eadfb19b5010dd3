from __future__ import annotations

from django.db.models import QuerySet
from django.http import HttpResponse
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import generics, status
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from replays import agents, approval, dispatch, importing, planning
from replays.api.errors import ApiError
from replays.api.serializers import (
    ApprovalSerializer,
    ApproveInputSerializer,
    BatchSerializer,
    ModelInfoSerializer,
    PlanSerializer,
    RunConfigSerializer,
    RunDetailSerializer,
    ThreadDetailSerializer,
    ThreadImportInputSerializer,
    ThreadImportOutputSerializer,
    ThreadSerializer,
)
from replays.models import Batch, Plan, PlanStatus, Run, Thread


class ThreadListView(generics.ListAPIView):
    serializer_class = ThreadSerializer

    def get_queryset(self) -> QuerySet[Thread]:
        return Thread.objects.search(self.request.query_params.get("search", ""))

    @extend_schema(
        parameters=[
            OpenApiParameter("search", str, description="Text in the title, folder or a request.")
        ]
    )
    def get(self, request: Request, *args: object, **kwargs: object) -> Response:
        return super().get(request, *args, **kwargs)


class ThreadDetailView(generics.RetrieveAPIView):
    serializer_class = ThreadDetailSerializer
    queryset = Thread.objects.prefetch_related("turns")


class ThreadImportView(APIView):
    parser_classes = [MultiPartParser]

    @extend_schema(
        request={"multipart/form-data": ThreadImportInputSerializer},
        responses={
            201: OpenApiResponse(
                ThreadImportOutputSerializer, description="New or changed thread."
            ),
            200: OpenApiResponse(
                ThreadImportOutputSerializer, description="Unchanged: nothing written."
            ),
            400: OpenApiResponse(description="Not a transcript."),
            413: OpenApiResponse(description="Larger than the transcript limit."),
        },
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
    @extend_schema(request=RunConfigSerializer, responses={201: PlanSerializer})
    def post(self, request: Request) -> Response:
        try:
            prepared = planning.prepare_plan(owner=request.user, raw_configuration=request.data)
        except (planning.PlanInputError, planning.PrepareConflict) as exc:
            raise ApiError(
                code=exc.code, message=exc.message, status_code=exc.status, details=exc.details
            ) from None
        body = _plan_body(prepared.plan, prepare_token=prepared.prepare_token)
        return Response(PlanSerializer(body).data, status=status.HTTP_201_CREATED)


class PlanDetailView(APIView):
    @extend_schema(responses={200: PlanSerializer})
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
    @extend_schema(
        request=ApproveInputSerializer,
        responses={201: ApprovalSerializer, 200: ApprovalSerializer},
        description="First approval: 201 with the new batch. The same approval again: 200 with "
        "the same batch and idempotent=true.",
    )
    def post(self, request: Request, pk: int) -> Response:
        data = request.data if isinstance(request.data, dict) else {}
        try:
            result = approval.approve_plan(
                plan_id=pk,
                user=request.user,
                approved=data.get("approved"),
                prepare_token=data.get("prepare_token"),
                run_config=data.get("run_config"),
            )
        except approval.ApprovalError as exc:
            raise ApiError(
                code=exc.code, message=exc.message, status_code=exc.status, details=exc.details
            ) from None
        code = status.HTTP_200_OK if result.idempotent else status.HTTP_201_CREATED
        return Response(approval_body(result), status=code)


class BatchDetailView(APIView):
    @extend_schema(responses={200: BatchSerializer})
    def get(self, request: Request, pk: int) -> Response:
        batch = get_object_or_404(Batch.objects.visible_to(request.user), pk=pk)
        return Response(BatchSerializer(batch).data)


class BatchCancelView(APIView):
    @extend_schema(request=None, responses={200: BatchSerializer})
    def post(self, request: Request, pk: int) -> Response:
        batch = get_object_or_404(Batch.objects.visible_to(request.user), pk=pk)
        batch = dispatch.cancel_batch(batch=batch)
        return Response(BatchSerializer(batch).data)


class RunDetailView(APIView):
    @extend_schema(responses={200: RunDetailSerializer})
    def get(self, request: Request, pk: int) -> Response:
        run = get_object_or_404(
            Run.objects.visible_to(request.user).select_related("thread", "batch"), pk=pk
        )
        return Response(RunDetailSerializer(run).data)


class RunCancelView(APIView):
    @extend_schema(request=None, responses={200: RunDetailSerializer})
    def post(self, request: Request, pk: int) -> Response:
        run = get_object_or_404(
            Run.objects.visible_to(request.user).select_related("thread", "batch"), pk=pk
        )
        run = dispatch.cancel_run(run=run)
        return Response(RunDetailSerializer(run).data)


class RunDiffView(APIView):
    @extend_schema(
        responses={
            (200, "text/plain"): OpenApiResponse(
                str, description="Unified diff against the baseline."
            )
        }
    )
    def get(self, request: Request, pk: int) -> HttpResponse:
        run = get_object_or_404(
            Run.objects.visible_to(request.user).select_related("thread", "batch"), pk=pk
        )
        response = HttpResponse(run.diff, content_type="text/plain; charset=utf-8")
        response["Content-Disposition"] = f'inline; filename="run-{run.pk}.diff"'
        return response


class ModelListView(APIView):
    @extend_schema(responses={200: ModelInfoSerializer(many=True)})
    def get(self, request: Request) -> Response:
        return Response(ModelInfoSerializer(agents.discover_models(), many=True).data)
