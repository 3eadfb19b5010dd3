from __future__ import annotations

from django.db.models import Exists, OuterRef, Q, QuerySet
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import generics, status
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from replays import importing
from replays.api.errors import ApiError
from replays.api.serializers import (
    ThreadDetailSerializer,
    ThreadImportInputSerializer,
    ThreadImportOutputSerializer,
    ThreadSerializer,
)
from replays.models import Thread, Turn


def search_threads(queryset: QuerySet[Thread], text: str) -> QuerySet[Thread]:
    """Threads whose title, folder or any request contains the text (case-insensitive)."""
    text = text.strip()
    if not text:
        return queryset
    in_requests = Turn.objects.filter(thread=OuterRef("pk"), request__icontains=text)
    return queryset.filter(Q(title__icontains=text) | Q(cwd__icontains=text) | Exists(in_requests))


class ThreadListView(generics.ListAPIView):
    serializer_class = ThreadSerializer

    def get_queryset(self) -> QuerySet[Thread]:
        return search_threads(Thread.objects.all(), self.request.query_params.get("search", ""))

    @extend_schema(
        parameters=[OpenApiParameter("search", str, description="Text in the title, folder or a request.")]
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
            201: OpenApiResponse(ThreadImportOutputSerializer, description="New or changed thread."),
            200: OpenApiResponse(ThreadImportOutputSerializer, description="Unchanged: nothing written."),
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
        result = importing.import_uploaded_transcript(upload=upload, filename=upload.name, user=request.user)
        if result.outcome == "failed":
            raise ApiError(code="not_a_transcript", message=result.error)
        thread = Thread.objects.prefetch_related("turns").get(pk=result.thread.pk)
        body = ThreadImportOutputSerializer(
            {"outcome": result.outcome, "thread": thread, "lines_skipped": result.problems},
            context={"request": request},
        ).data
        code = status.HTTP_200_OK if result.outcome == "unchanged" else status.HTTP_201_CREATED
        return Response(body, status=code)
