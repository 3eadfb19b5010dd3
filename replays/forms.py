from __future__ import annotations

from decimal import Decimal
from typing import Any

from django import forms
from django.conf import settings
from django.core.files.uploadedfile import UploadedFile
from django.utils.html import format_html
from django.utils.text import Truncator

from replays import campaigns
from replays.agents import ModelInfo
from replays.evaluation.checks import JUNIT_VARIABLE
from replays.evaluation.evaluators import EvaluatorInfo
from replays.models import SourceKind, Thread


def readable_size(size: int) -> str:
    if size < 1024 * 1024:
        return f"{size / 1024:.1f} KiB"
    return f"{size / (1024 * 1024):.1f} MiB"


class TranscriptUploadForm(forms.Form):
    transcript = forms.FileField(
        label="Transcript file",
        help_text="A session file of Claude Code (.jsonl under ~/.claude/projects/), Codex "
        "(rollout-*.jsonl under ~/.codex/sessions/), Gemini CLI (session-*.json or .jsonl under "
        "~/.gemini/tmp/<project>/chats/) or pi (.jsonl under ~/.pi/agent/sessions/), or an "
        "OpenCode session as `opencode export <session id>` prints it (.json).",
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


# --- Replays -----------------------------------------------------------------------------

# The ids of the two calibration baselines (see replays.agents.baselines).
BASELINE_DESCRIPTIONS = {
    "historical": "Re-applies the diff the historical session produced: the score a perfect "
    "replay would get.",
    "empty": "Changes nothing: the floor any model has to beat.",
}
MAX_TIMEOUT_MINUTES = 24 * 60


def first_line(text: str, limit: int = 80) -> str:
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return Truncator(line).chars(limit) or "(empty request)"


def evaluator_choice_label(info: EvaluatorInfo) -> str:
    """The evaluator with its availability, as GET /api/evaluators/ says it."""
    if not info.available:
        return f"{info.label} (unavailable: {info.reason})"
    if info.is_tests:
        return f"{info.label}: needs a verify command"
    return f"{info.label} (available)"


class SelectWithDisabled(forms.Select):
    """A select whose options in `disabled_values` are shown but cannot be picked."""

    disabled_values: set[str]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.disabled_values = set()

    def create_option(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        option = super().create_option(*args, **kwargs)
        if option["value"] in self.disabled_values:
            option["attrs"]["disabled"] = True
        return option


class OffersModels:
    """A form's model checkboxes and evaluator select, as discovery found them (the replay
    form's and the campaign form's): unavailable ones shown with why, not selectable."""

    fields: dict[str, Any]
    model_infos: list[ModelInfo]

    def offer(self, model_infos: list[ModelInfo], evaluator_infos: list[EvaluatorInfo]) -> None:
        self.model_infos = model_infos
        self.fields["models"].choices = [(info.id, info.label) for info in model_infos]
        self.fields["evaluator"].choices = [("", "Default (decided by prepare)")] + [
            (info.id, evaluator_choice_label(info)) for info in evaluator_infos
        ]
        self.fields["evaluator"].widget.disabled_values = {
            info.id for info in evaluator_infos if not info.available
        }
        self.fields["timeout_minutes"].initial = max(
            1, round(settings.REPLAYS_DEFAULT_TIMEOUT_SECONDS / 60)
        )

    def model_options(self) -> list[dict[str, Any]]:
        """The checkboxes: baselines first (with what they calibrate), then the agents' models."""
        chosen = set(self["models"].value() or [])  # type: ignore[index]
        return [
            {
                "info": info,
                "checked": info.id in chosen and info.available,
                "description": BASELINE_DESCRIPTIONS.get(info.id, ""),
                "html_id": f"id_models_{index}",
            }
            for index, info in enumerate(self.model_infos)
        ]


class ReplayForm(OffersModels, forms.Form):
    """One thread, a range of its requests, and the models to replay it with.

    Only shapes the input: prepare (replays.planning) validates the configuration and
    says what is wrong with it, in the same words the API uses.
    """

    models = forms.MultipleChoiceField(
        label="Models", required=False, widget=forms.CheckboxSelectMultiple
    )
    start_message_uuid = forms.ChoiceField(label="First request")
    end_message_uuid = forms.ChoiceField(label="Last request")
    repository = forms.CharField(
        label="Repository",
        required=False,
        max_length=4096,
        help_text="Path of a clone on this machine. Default: the thread's folder.",
    )
    baseline_commit = forms.CharField(
        label="Baseline commit",
        required=False,
        max_length=64,
        help_text="Default: the last commit before the first request.",
    )
    ending_commit = forms.CharField(
        label="Ending commit",
        required=False,
        max_length=64,
        help_text="Default: the last commit before the next request.",
    )
    timeout_minutes = forms.IntegerField(
        label="Timeout",
        min_value=1,
        max_value=MAX_TIMEOUT_MINUTES,
        help_text="Minutes per run.",
    )
    verify_command = forms.CharField(
        label="Verify command",
        required=False,
        max_length=4000,
        help_text=format_html(
            "Optional. Runs without a shell on the baseline, the historical result and every "
            "run, with the historical tests laid over. <code>{}</code> in it becomes a path "
            "for JUnit XML; the same path is in <code>{}</code>. For example <code>{}</code>.",
            "{junit_xml}",
            JUNIT_VARIABLE,
            "pytest -q --junitxml={junit_xml}",
        ),
    )

    evaluator = forms.ChoiceField(
        label="Evaluator",
        required=False,
        widget=SelectWithDisabled,
        help_text="Who judges each run against history (those that cannot judge here say "
        "why). Default: decided by prepare, shown before you approve.",
    )

    context = forms.ChoiceField(
        label="Context",
        required=False,
        choices=[
            ("", "Default (decided per model by prepare)"),
            ("cold", "Cold: the request alone"),
            ("digest", "Digest: the earlier requests and answers, then the request"),
            ("fork", "Fork: the historical session, resumed by the model's own agent"),
        ],
        help_text="What each model knows before the first request of the range. Default: "
        "cold for the thread's first request; for a later one, fork when the model's agent "
        "is the thread's own tool, else digest. The plan shows each model's context.",
    )

    def __init__(
        self,
        *args: Any,
        thread: Thread,
        model_infos: list[ModelInfo],
        evaluator_infos: list[EvaluatorInfo],
        known_clones: list[dict[str, str]] | None = None,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        self.thread = thread
        # Offered up front when the thread's folder is not a repository here (planning).
        self.known_clones = known_clones or []
        self.offer(model_infos, evaluator_infos)
        # A request the user rolled back is not offered: the thread went on without it.
        turns = list(
            thread.turns.filter(rolled_back=False)
            .order_by("index")
            .only("index", "message_uuid", "request")
        )
        choices = [
            (turn.message_uuid, f"#{turn.index + 1} · {first_line(turn.request)}") for turn in turns
        ]
        self.fields["start_message_uuid"].choices = choices
        self.fields["end_message_uuid"].choices = choices
        if turns:
            self.fields["start_message_uuid"].initial = turns[0].message_uuid
            self.fields["end_message_uuid"].initial = turns[-1].message_uuid
        for name in ("repository", "baseline_commit", "ending_commit", "verify_command"):
            self.fields[name].widget.attrs.update(autocomplete="off", spellcheck="false")
        self.fields["repository"].widget.attrs["placeholder"] = thread.cwd or "/path/to/clone"
        if self.known_clones:
            first = self.known_clones[0]
            self.fields["repository"].initial = first["repository"]
            self.fields["repository"].widget.attrs["list"] = "known-clones"
            self.fields["repository"].help_text = (
                f"The thread's folder {thread.cwd or '(none recorded)'} is not a git repository "
                f"here; {first['repository']} is {first['reason']}"
                + (" (more in the list)." if len(self.known_clones) > 1 else ".")
            )

    def configuration(self) -> dict[str, Any]:
        """The raw configuration for planning.prepare_plan (call after is_valid())."""
        data = self.cleaned_data
        return {
            "configurations": [
                {
                    "thread_id": self.thread.pk,
                    "start_message_uuid": data["start_message_uuid"],
                    "end_message_uuid": data["end_message_uuid"],
                    "repository": data["repository"] or None,
                    "baseline_commit": data["baseline_commit"] or None,
                    "ending_commit": data["ending_commit"] or None,
                }
            ],
            "models": data["models"],
            "timeout_seconds": data["timeout_minutes"] * 60,
            "verify_command": data["verify_command"] or None,
            "evaluator": data["evaluator"] or None,
            "context": data["context"] or None,
        }


# A question's answer fills one field of the thread's configuration and prepares again.
ANSWERABLE_FIELDS = ("repository", "baseline_commit", "ending_commit")


class AnswerForm(forms.Form):
    thread_id = forms.IntegerField(min_value=1)
    field = forms.ChoiceField(choices=[(name, name) for name in ANSWERABLE_FIELDS])
    choice = forms.CharField(required=False, max_length=4096)
    value = forms.CharField(required=False, max_length=4096)

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        # A typed value wins over a picked commit: it is the more deliberate answer.
        answer = (data.get("value") or "").strip() or (data.get("choice") or "").strip()
        if not answer:
            raise forms.ValidationError("Pick one of the commits or type an answer.")
        data["answer"] = answer
        return data


# --- Campaigns ---------------------------------------------------------------------------

CONTEXT_CHOICES = [
    ("", "Default (decided per request and model by prepare)"),
    ("cold", "Cold: the request alone"),
    ("digest", "Digest: the earlier requests and answers, then the request"),
    ("fork", "Fork: the historical session, resumed by the model's own agent"),
]
# A service error's field (details["field"]) -> the form's field that shows it.
CAMPAIGN_ERROR_FIELDS = {
    "models": "models",
    "evaluator": "evaluator",
    "context": "context",
    "limit": "limit",
    "seed": "seed",
    "selection": "selection",
    "budget_usd": "budget_usd",
    "gradable_only": "gradable_only",
    "verify_commands": "verify_commands",
    "clones": "clones",
    "timeout_seconds": "timeout_minutes",
    "filters.tool": "tool",
    "tool": "tool",
    "repository": "repository",
    "folder": "folder",
    "since": "since",
    "until": "until",
    "filters.until": "until",
    "last": "scan_last",
}


class DateInput(forms.DateInput):
    input_type = "date"


class CampaignForm(OffersModels, forms.Form):
    """Which of the user's own requests to scan, how many to select, the models, the
    evaluator and the budget. Only shapes the input: prepare (replays.campaigns) validates
    the configuration and says what is wrong, in the same words the API and the command use."""

    tool = forms.ChoiceField(
        label="Tool",
        required=False,
        choices=[("", "Any tool"), *SourceKind.choices],
    )
    repository = forms.CharField(
        label="Repository",
        required=False,
        max_length=4096,
        help_text="Only threads started in this repository or below it.",
    )
    folder = forms.CharField(
        label="Folder",
        required=False,
        max_length=4096,
        help_text="Only threads started in this folder or below it.",
    )
    since = forms.DateField(label="Since", required=False, widget=DateInput)
    until = forms.DateField(label="Until", required=False, widget=DateInput)
    scan_last = forms.IntegerField(
        label="Scan at most",
        min_value=1,
        max_value=campaigns.MAX_SCAN,
        initial=campaigns.DEFAULT_SCAN,
        help_text="The newest requests the filters keep.",
    )
    selection = forms.ChoiceField(
        label="Selection",
        choices=[
            ("last", "The last N eligible requests"),
            ("sample", "A seeded random sample of N"),
        ],
        initial="last",
        widget=forms.RadioSelect,
    )
    limit = forms.IntegerField(
        label="N",
        min_value=1,
        max_value=campaigns.MAX_SELECTED,
        initial=20,
        help_text="Requests to replay with every model.",
    )
    seed = forms.IntegerField(
        label="Seed",
        required=False,
        min_value=0,
        max_value=2**31,
        help_text="The same seed and history select the same requests.",
    )
    models = forms.MultipleChoiceField(
        label="Models", required=False, widget=forms.CheckboxSelectMultiple
    )
    evaluator = forms.ChoiceField(
        label="Evaluator",
        required=False,
        widget=SelectWithDisabled,
        help_text="Who judges every run against history. Default: decided by prepare, shown "
        "before you approve. tests judges by each repository's test command alone and costs "
        "nothing.",
    )
    budget_usd = forms.DecimalField(
        label="Budget (USD)",
        required=False,
        min_value=Decimal("0.01"),
        max_digits=14,
        decimal_places=2,
        help_text="Runs start only while what was spent plus what runs now stays within it; "
        "the rest end budget exhausted. Empty: no budget.",
    )
    gradable_only = forms.BooleanField(
        label="Gradable requests only",
        required=False,
        help_text="Only requests whose own change the tests see (a test fails before and "
        "passes after). Prepare then runs the tests of each candidate: it takes longer.",
    )
    verify_commands = forms.CharField(
        label="Test commands",
        required=False,
        max_length=40_000,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text=format_html(
            "One <code>{}</code> per line. A repository left out uses the test runner its "
            "historical agent ran there, if it ran one.",
            "REPOSITORY=COMMAND",
        ),
    )
    clones = forms.CharField(
        label="Clones",
        required=False,
        max_length=40_000,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text=format_html(
            "One <code>{}</code> per line: where the repository of threads started in a "
            "folder that is gone (or elsewhere) is now.",
            "RECORDED_FOLDER=CLONE",
        ),
    )
    timeout_minutes = forms.IntegerField(
        label="Timeout",
        min_value=1,
        max_value=MAX_TIMEOUT_MINUTES,
        help_text="Minutes per run.",
    )
    context = forms.ChoiceField(label="Context", required=False, choices=CONTEXT_CHOICES)

    def __init__(
        self,
        *args: Any,
        model_infos: list[ModelInfo],
        evaluator_infos: list[EvaluatorInfo],
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        self.offer(model_infos, evaluator_infos)
        for name in ("repository", "folder", "verify_commands", "clones"):
            self.fields[name].widget.attrs.update(autocomplete="off", spellcheck="false")
        self.fields["repository"].widget.attrs["placeholder"] = "/path/to/clone"
        self.fields["folder"].widget.attrs["placeholder"] = "/path/to/projects"
        self.fields["verify_commands"].widget.attrs["placeholder"] = (
            "/path/to/clone=.venv/bin/python -m pytest -q --junitxml={junit_xml}"
        )

    @classmethod
    def initial_from(cls, configuration: dict[str, Any]) -> dict[str, Any]:
        """A prepared campaign's configuration as the form's initial values (its way back)."""
        filters = configuration.get("filters") or {}
        modes = configuration.get("context")
        timeout = configuration.get("timeout_seconds") or settings.REPLAYS_DEFAULT_TIMEOUT_SECONDS
        return {
            "tool": filters.get("tool") or "",
            "repository": filters.get("repository") or "",
            "folder": filters.get("folder") or "",
            "since": filters.get("since"),
            "until": filters.get("until"),
            "scan_last": filters.get("last") or campaigns.DEFAULT_SCAN,
            "selection": configuration.get("selection") or "last",
            "limit": configuration.get("limit") or 20,
            "seed": configuration.get("seed")
            if configuration.get("selection") == "sample"
            else None,
            "models": configuration.get("models") or [],
            "evaluator": configuration.get("evaluator") or "",
            "budget_usd": configuration.get("budget_usd"),
            "gradable_only": bool(configuration.get("gradable_only")),
            "verify_commands": "\n".join(
                f"{repository}={command}"
                for repository, command in (configuration.get("verify_commands") or {}).items()
            ),
            "clones": "\n".join(
                f"{folder}={clone}" for folder, clone in (configuration.get("clones") or {}).items()
            ),
            "timeout_minutes": max(1, round(timeout / 60)),
            # One mode for every model is what the form offers; a mix is shown as default.
            "context": next(iter(set(modes.values())))
            if isinstance(modes, dict) and len(set(modes.values())) == 1
            else (modes if isinstance(modes, str) else ""),
        }

    def clean_verify_commands(self) -> dict[str, str]:
        """REPOSITORY=COMMAND lines as {repository: command}; blank lines are skipped."""
        return _pairs(self.cleaned_data["verify_commands"], "REPOSITORY=COMMAND", "test commands")

    def clean_clones(self) -> dict[str, str]:
        """RECORDED_FOLDER=CLONE lines as {recorded folder: clone}."""
        return _pairs(self.cleaned_data["clones"], "RECORDED_FOLDER=CLONE", "clones")

    def configuration(self) -> dict[str, Any]:
        """The raw configuration for campaigns.prepare_campaign and preview (after is_valid())."""
        data = self.cleaned_data
        budget = data["budget_usd"]
        sample = data["selection"] == "sample"
        return {
            "models": data["models"],
            "evaluator": data["evaluator"] or None,
            "limit": data["limit"],
            "selection": data["selection"],
            **({"seed": data["seed"] if data["seed"] is not None else 0} if sample else {}),
            "budget_usd": None if budget is None else str(budget),
            "gradable_only": data["gradable_only"],
            "filters": {
                "tool": data["tool"] or None,
                "repository": data["repository"].strip() or None,
                "folder": data["folder"].strip() or None,
                "since": data["since"].isoformat() if data["since"] else None,
                "until": data["until"].isoformat() if data["until"] else None,
                "last": data["scan_last"],
            },
            "verify_commands": data["verify_commands"],
            "clones": data["clones"],
            "timeout_seconds": data["timeout_minutes"] * 60,
            "context": data["context"] or None,
        }

    def add_service_error(self, field: str | None, message: str) -> None:
        """A refusal from prepare, shown at the field it is about when it names one."""
        name = CAMPAIGN_ERROR_FIELDS.get(field or "")
        self.add_error(name if name in self.fields else None, message)


def _pairs(text: str, shape: str, what: str) -> dict[str, str]:
    """KEY=VALUE lines as {key: value}; blank lines are skipped, a key given twice refused."""
    pairs: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        key, equals, value = line.partition("=")
        if not equals or not key.strip() or not value.strip():
            raise forms.ValidationError(
                "Line %(number)s is not %(shape)s: %(line)s",
                code="invalid",
                params={
                    "number": number,
                    "shape": shape,
                    "line": Truncator(line.strip()).chars(80),
                },
            )
        if key.strip() in pairs:
            raise forms.ValidationError(
                "%(key)s is given twice in the %(what)s.",
                code="invalid",
                params={"key": key.strip(), "what": what},
            )
        pairs[key.strip()] = value.strip()
    return pairs
