from __future__ import annotations

from rest_framework import serializers

from replays.models import Thread, Turn

TOKEN_KINDS = {
    "input": "input_tokens",
    "output": "output_tokens",
    "cache_read": "cache_read_tokens",
    "cache_write_5m": "cache_write_5m_tokens",
    "cache_write_1h": "cache_write_1h_tokens",
}


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


class TurnSerializer(serializers.ModelSerializer):
    models = serializers.ListField(source="models_used", child=serializers.CharField())
    tokens = TokensSerializer(source="*")
    cost_usd = serializers.DecimalField(
        max_digits=14, decimal_places=6, allow_null=True, coerce_to_string=False,
        help_text="Null when a model's price is unknown (never reported as 0).",
    )

    class Meta:
        model = Turn
        fields = ["message_uuid", "index", "timestamp", "request", "models", "tokens", "cost_usd", "seconds"]


class ThreadSerializer(serializers.ModelSerializer):
    models = serializers.ListField(source="models_used", child=serializers.CharField())
    tokens = TokensSerializer(source="*")
    cost_usd = serializers.DecimalField(
        max_digits=14, decimal_places=6, allow_null=True, coerce_to_string=False,
        help_text="Null when a model's price is unknown (never reported as 0).",
    )
    url = serializers.HyperlinkedIdentityField(view_name="api-thread-detail")

    class Meta:
        model = Thread
        fields = [
            "id", "url", "source_kind", "session_id", "title", "cwd", "git_branch", "git_commit",
            "repository_url", "cli_version", "started_at", "ended_at", "turn_count", "models",
            "tokens", "cost_usd", "seconds", "source_path", "source_sha256", "source_size",
            "imported_at", "updated_at",
        ]


class ThreadDetailSerializer(ThreadSerializer):
    turns = TurnSerializer(many=True, read_only=True)

    class Meta(ThreadSerializer.Meta):
        fields = [*ThreadSerializer.Meta.fields, "turns"]


class LineProblemSerializer(serializers.Serializer):
    line_number = serializers.IntegerField()
    message = serializers.CharField()


class ThreadImportInputSerializer(serializers.Serializer):
    file = serializers.FileField(help_text="A Claude Code transcript or a Codex session file (.jsonl).")


class ThreadImportOutputSerializer(serializers.Serializer):
    outcome = serializers.ChoiceField(choices=["new", "updated", "unchanged"])
    thread = ThreadDetailSerializer()
    lines_skipped = LineProblemSerializer(many=True)
