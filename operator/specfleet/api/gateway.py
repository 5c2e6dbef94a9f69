"""The gateway sidecar's configuration: the slice of the spec it needs to classify requests.

The renderer writes it into the `<name>-gateway` ConfigMap; the gateway reloads it when the
file changes, so editing classes never restarts GPU pods.
"""

from __future__ import annotations

from pydantic import Field

from specfleet.api.base import ApiModel
from specfleet.api.model import SpecModel
from specfleet.api.spec import Engine, PromptClass, SpeculativeSpec

CLASS_HEADER = "x-specfleet-class"


class Drafting(ApiModel):
    """How the engine drafts, as rendered. TensorRT-LLM reports a mean acceptance length per
    request, not counts: the gateway derives them, and needs this to tell a step the engine did
    not draft on (above max_concurrency, a depth-0 step) from a rejected draft."""

    depth_by_batch_size: dict[int, int] = Field(
        default_factory=dict,
        description="Draft tokens per step from each batch size on (0: no drafting); empty: "
        "numSpeculativeTokens at every batch size.",
    )
    every_step: bool = Field(
        default=True,
        description="False when the drafter proposes only where it finds a match (n-gram): "
        "how many steps drafted is then unknown.",
    )
    gated: bool = Field(
        default=False,
        description="The engine's own acceptance gate is on: once tripped it drafts no more "
        "until restart, so a request with nothing accepted may not have drafted at all.",
    )


class GatewayConfig(ApiModel):
    specmodel: str = Field(description="SpecModel name, for logs.")
    engine: Engine = Field(description="Which engine's response format to read.")
    served_name: str = Field(description="The model name clients use.")
    classes: list[PromptClass] = Field(min_length=1, description="Prompt classes, in order.")
    default_class: str = Field(description="Class of requests no rule matches.")
    class_header: str = Field(default=CLASS_HEADER, description="Header naming a class.")
    max_body_bytes: int = Field(default=8 * 1024 * 1024, description="Larger bodies get 413.")
    num_speculative_tokens: int | None = Field(
        default=None,
        ge=1,
        description="k of the speculation the engine runs now; None when it runs without. "
        "Only TensorRT-LLM needs it: its responses carry a mean acceptance length, not counts.",
    )
    drafting: Drafting | None = Field(
        default=None, description="TensorRT-LLM: how the running speculation drafts."
    )

    @classmethod
    def from_specmodel(
        cls,
        specmodel: SpecModel,
        running: SpeculativeSpec | None,
        drafting: Drafting | None = None,
    ) -> GatewayConfig:
        """`running` is the speculation the engine runs now (None with speculation off);
        `drafting` how the rendered engine drafts it, where the gateway needs that."""
        spec = specmodel.spec
        return cls(
            specmodel=specmodel.metadata.name,
            engine=spec.engine.name,
            served_name=specmodel.served_name(),
            classes=spec.classes,
            default_class=spec.default_class,
            num_speculative_tokens=running.num_speculative_tokens if running else None,
            drafting=drafting if running else None,
        )
