from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from replays import accounts, hosts
from replays.models import (
    ApiToken,
    Batch,
    Campaign,
    CampaignRequest,
    Host,
    LaunchError,
    Plan,
    Report,
    Review,
    Run,
    Thread,
    Turn,
)

TOKEN_READONLY = (
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_5m_tokens",
    "cache_write_1h_tokens",
    "cost_usd",
)


@admin.display(description="Cost")
def cost_display(obj: Thread | Turn | Run) -> str:
    return "unknown price" if obj.cost_usd is None else f"${obj.cost_usd:.4f}"


class ReadOnlyInline(admin.TabularInline):
    """Rows shown beside their parent; they are written by the protocol, never here."""

    extra = 0
    can_delete = False
    show_change_link = True

    def get_readonly_fields(self, request: HttpRequest, obj: object = None) -> tuple[str, ...]:
        return tuple(self.fields or ())

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


class TurnInline(ReadOnlyInline):
    model = Turn
    fields = (
        "index",
        "timestamp",
        "short_request",
        "models_used",
        "input_tokens",
        "output_tokens",
        "cost_usd",
        "seconds",
    )

    @admin.display(description="Request")
    def short_request(self, turn: Turn) -> str:
        return turn.request[:120]


@admin.register(Thread)
class ThreadAdmin(admin.ModelAdmin):
    list_display = (
        "title",
        "source_kind",
        "cwd",
        "git_branch",
        "started_at",
        "turn_count",
        cost_display,
        "imported_at",
    )
    list_filter = ("source_kind", "git_branch", "started_at")
    search_fields = ("title", "session_id", "cwd", "turns__request")
    date_hierarchy = "started_at"
    readonly_fields = (
        "source_kind",
        "session_id",
        "source_path",
        "source_sha256",
        "source_size",
        "git_commit",
        "cli_version",
        "turn_count",
        "models_used",
        "seconds",
        "owner",
        "imported_at",
        "updated_at",
        *TOKEN_READONLY,
    )
    inlines = [TurnInline]

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Thread], search_term: str
    ):
        queryset, _ = super().get_search_results(request, queryset, search_term)
        # Searching requests joins turns: keep one row per thread.
        return queryset.distinct(), False


@admin.register(Turn)
class TurnAdmin(admin.ModelAdmin):
    list_display = ("thread", "index", "timestamp", "short_request", cost_display, "seconds")
    list_filter = ("thread__source_kind",)
    search_fields = ("request", "message_uuid", "thread__title")
    list_select_related = ("thread",)
    # Everything a turn has came from its transcript: a replay runs its request as imported
    # (and approval refuses a request that changed since prepare).
    readonly_fields = (
        "thread",
        "index",
        "message_uuid",
        "timestamp",
        "request",
        "models_used",
        "usage_by_model",
        "seconds",
        "model_seconds",
        "last_answer_at",
        "evidence",
        *TOKEN_READONLY,
    )

    @admin.display(description="Request")
    def short_request(self, turn: Turn) -> str:
        return turn.request[:80]


class BatchInline(ReadOnlyInline):
    model = Batch
    fields = ("id", "owner", "thread_count", "approved_at")


@admin.register(Plan)
class PlanAdmin(admin.ModelAdmin):
    list_display = ("id", "owner", "status", "approval_prompt", "created_at", "expires_at")
    list_filter = ("status", "created_at")
    search_fields = ("fingerprint", "owner__username", "approval_prompt")
    list_select_related = ("owner",)
    # Approval happens through the protocol only: nothing here can mint or alter a plan.
    readonly_fields = (
        "owner",
        "configuration",
        "fingerprint",
        "preparations",
        "status",
        "blockers",
        "questions",
        "approval_prompt",
        "token_hash",
        "created_at",
        "expires_at",
    )
    inlines = [BatchInline]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


class RunInline(ReadOnlyInline):
    model = Run
    fields = ("thread", "model", "status", "phase", "failure_code", "cost_usd", "wall_seconds")


@admin.register(Batch)
class BatchAdmin(admin.ModelAdmin):
    list_display = ("id", "owner", "plan", "thread_count", "approved_at")
    list_filter = ("approved_at",)
    search_fields = ("owner__username",)
    list_select_related = ("owner", "plan")
    readonly_fields = (
        "plan",
        "owner",
        "models_list",
        "configuration",
        "thread_count",
        "approved_at",
    )
    inlines = [RunInline]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


class ProtocolReadOnlyAdmin(admin.ModelAdmin):
    """Rows that change only through the services (evaluation, the protocol)."""

    def get_readonly_fields(self, request: HttpRequest, obj: object = None) -> list[str]:
        return [field.name for field in self.model._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(Run)
class RunAdmin(ProtocolReadOnlyAdmin):
    list_display = (
        "id",
        "batch",
        "thread",
        "model",
        "status",
        "phase",
        "failure_code",
        "host",
        cost_display,
        "wall_seconds",
        "created_at",
    )
    list_filter = ("status", "phase", "failure_code", "host", "model")
    search_fields = ("model", "thread__title", "failure_message", "host")
    # A run changes only through the protocol (dispatch, coordinator, reconcile, cancel).
    list_select_related = ("batch", "thread")


@admin.register(LaunchError)
class LaunchErrorAdmin(admin.ModelAdmin):
    list_display = ("run", "code", "host", "created_at")
    list_filter = ("code", "host")
    search_fields = ("message", "host")
    readonly_fields = ("run", "code", "message", "host", "created_at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(Review)
class ReviewAdmin(ProtocolReadOnlyAdmin):
    list_display = (
        "id",
        "thread",
        "start_message_uuid",
        "end_message_uuid",
        "evaluator",
        "status",
        cost_display,
        "seconds",
        "created_at",
    )
    list_filter = ("status", "evaluator")
    search_fields = ("thread__title", "evaluator", "error")
    list_select_related = ("thread",)


@admin.register(Report)
class ReportAdmin(ProtocolReadOnlyAdmin):
    list_display = (
        "id",
        "run",
        "status",
        "is_current",
        "winner",
        "score_historical",
        "score_replay",
        "consistent",
        "evaluator",
        "prompt_version",
        "created_at",
    )
    list_filter = ("status", "is_current", "winner", "consistent", "evaluator", "prompt_version")
    search_fields = ("run__model", "run__thread__title", "evaluator", "reason")
    list_select_related = ("run",)


@admin.register(Host)
class HostAdmin(ProtocolReadOnlyAdmin):
    """The machines whose clusters reported (written by the clusters, replays/hosts.py).
    Read-only; a removed machine's row may be deleted (the doctor reports it stale)."""

    list_display = ("name", "last_seen_at", "clock_skew", "capacity", "agents", "first_seen_at")
    search_fields = ("name",)

    @admin.display(description="Clock skew")
    def clock_skew(self, host: Host) -> str:
        seconds = hosts.clock_skew(host).total_seconds()
        return f"{seconds:+.1f} s"

    @admin.display(description="Agents")
    def agents(self, host: Host) -> str:
        versions = host.agent_versions if isinstance(host.agent_versions, dict) else {}
        return ", ".join(
            f"{name} {answer}" if isinstance(answer, str) else f"{name}: not runnable"
            for name, answer in sorted(versions.items())
        )


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """API tokens: only their sha256 is kept. Adding one makes a new key for the user
    chosen and shows it once, in the page's message; nothing here shows a key again."""

    list_display = ("user", "prefix", "created_at")
    list_select_related = ("user",)
    search_fields = ("user__username", "prefix")
    fields = ("user", "prefix", "created_at")
    readonly_fields = ("prefix", "created_at")

    def get_readonly_fields(self, request: HttpRequest, obj: object = None) -> tuple[str, ...]:
        # A token belongs to whom it was made for: only a new one chooses its user.
        return ("user", *self.readonly_fields) if obj is not None else self.readonly_fields

    def save_model(self, request: HttpRequest, obj: ApiToken, form: Any, change: bool) -> None:
        if change:
            return
        token, key = accounts.create_api_token(user=obj.user)
        obj.pk, obj.key_sha256, obj.prefix = token.pk, token.key_sha256, token.prefix
        obj._state.adding = False
        messages.warning(
            request,
            f"The new token of {obj.user}: {key} (send it as 'Authorization: Token <key>'). "
            "Copy it now: only its sha256 is kept, it is not shown again.",
        )


@admin.register(Campaign)
class CampaignAdmin(ProtocolReadOnlyAdmin):
    """Campaigns change only through replays.campaigns (prepare, approve, cancel) and their
    results only through replays.evaluation.campaign_results: read-only here."""

    list_display = (
        "id",
        "owner",
        "status",
        "scanned",
        "eligible",
        "selected",
        "budget",
        "created_at",
        "approved_at",
    )
    list_filter = ("status", "created_at")
    search_fields = ("owner__username", "fingerprint", "approval_prompt")
    list_select_related = ("owner",)
    date_hierarchy = "created_at"
    exclude = ("results",)

    def get_readonly_fields(self, request: HttpRequest, obj: object = None) -> list[str]:
        # The results as indented JSON (the raw field is hidden), and a way to the rows.
        fields = [name for name in super().get_readonly_fields(request, obj) if name != "results"]
        return [*fields, "requests_link", "batches_link", "page_link", "results_json"]

    @admin.display(description="Scanned")
    def scanned(self, campaign: Campaign) -> int:
        return int((campaign.counts or {}).get("scanned", 0))

    @admin.display(description="Eligible")
    def eligible(self, campaign: Campaign) -> int:
        return int((campaign.counts or {}).get("eligible", 0))

    @admin.display(description="Selected")
    def selected(self, campaign: Campaign) -> int:
        return int((campaign.counts or {}).get("selected", 0))

    @admin.display(description="Budget", ordering="budget_usd")
    def budget(self, campaign: Campaign) -> str:
        return "none" if campaign.budget_usd is None else f"${campaign.budget_usd}"

    @admin.display(description="Scanned requests")
    def requests_link(self, campaign: Campaign) -> str:
        url = reverse("admin:replays_campaignrequest_changelist")
        return format_html(
            '<a href="{}?campaign={}">{} request(s), {} selected</a>',
            url, campaign.pk, self.scanned(campaign), self.selected(campaign),
        )  # fmt: skip

    @admin.display(description="Batches")
    def batches_link(self, campaign: Campaign) -> str:
        url = reverse("admin:replays_batch_changelist")
        return format_html(
            '<a href="{}?campaign={}">One batch per selected request</a>',
            url, campaign.pk,
        )  # fmt: skip

    @admin.display(description="Page")
    def page_link(self, campaign: Campaign) -> str:
        return format_html(
            '<a href="{}">Campaign {} on the site</a>', campaign.get_absolute_url(), campaign.pk
        )

    @admin.display(description="Results")
    def results_json(self, campaign: Campaign) -> str:
        text = json.dumps(campaign.results or {}, indent=2, ensure_ascii=False)
        return format_html('<pre style="white-space: pre-wrap">{}</pre>', text)


@admin.register(CampaignRequest)
class CampaignRequestAdmin(ProtocolReadOnlyAdmin):
    """What a campaign's scan decided about each request (written by prepare only)."""

    list_display = (
        "id",
        "campaign",
        "position",
        "thread",
        "turn_number",
        "eligible",
        "reason",
        "gradable",
        "selected",
        "repository",
    )
    list_filter = ("reason", "eligible", "selected", "gradable")
    search_fields = ("repository", "detail", "thread__title", "turn__message_uuid")
    list_select_related = ("campaign", "thread", "turn")
    ordering = ("campaign", "position")

    @admin.display(description="Request", ordering="turn__index")
    def turn_number(self, request: CampaignRequest) -> str:
        return f"#{request.turn.index + 1}"
