from __future__ import annotations

from django import forms
from django.conf import settings
from django.core.files.uploadedfile import UploadedFile


def readable_size(size: int) -> str:
    if size < 1024 * 1024:
        return f"{size / 1024:.1f} KiB"
    return f"{size / (1024 * 1024):.1f} MiB"


class TranscriptUploadForm(forms.Form):
    transcript = forms.FileField(
        label="Transcript file",
        help_text="A Claude Code session (.jsonl under ~/.claude/projects/) or a Codex session "
        "(rollout-*.jsonl under ~/.codex/sessions/).",
        widget=forms.FileInput(attrs={"accept": ".jsonl,.json,application/jsonl,text/plain"}),
    )

    def clean_transcript(self) -> UploadedFile:
        upload: UploadedFile = self.cleaned_data["transcript"]
        limit = settings.REPLAYS_MAX_TRANSCRIPT_BYTES
        # Refuse early with the size in the message; the import service checks again while copying.
        if upload.size is not None and upload.size > limit:
            raise forms.ValidationError(
                "%(name)s is %(size)s, larger than the transcript limit of %(limit)s.",
                code="too_large",
                params={
                    "name": upload.name,
                    "size": readable_size(upload.size),
                    "limit": readable_size(limit),
                },
            )
        return upload
