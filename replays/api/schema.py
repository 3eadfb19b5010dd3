"""What drf-spectacular cannot say by itself about our request bodies."""

from __future__ import annotations

from typing import Any

from replays.api.serializers import (
    ApproveInputSerializer,
    JudgeInputSerializer,
    RunConfigSerializer,
    ThreadConfigurationSerializer,
)

# Bodies whose unknown fields are refused (replays.planning, replays.api.views.json_object).
CLOSED_BODIES = (
    RunConfigSerializer,
    ThreadConfigurationSerializer,
    ApproveInputSerializer,
    JudgeInputSerializer,
)


def refuse_unknown_fields(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """A POSTPROCESSING_HOOKS hook: `additionalProperties: false` on the closed bodies."""
    schemas = result.get("components", {}).get("schemas", {})
    for serializer in CLOSED_BODIES:
        component = schemas.get(serializer.__name__.removesuffix("Serializer"))
        if component is not None:
            component["additionalProperties"] = False
    return result
