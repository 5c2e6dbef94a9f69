"""The gateway sidecar's configuration: the slice of the spec it needs to classify requests.

The renderer writes it into the `<name>-gateway` ConfigMap; the gateway reloads it when the
file changes, so editing classes never restarts GPU pods.
"""

from __future__ import annotations

import ipaddress
from typing import Self
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from specfleet.api.base import ApiModel
from specfleet.api.model import SpecModel
from specfleet.api.spec import Engine, PromptClass, SpeculativeSpec

CLASS_HEADER = "x-specfleet-class"
MIRRORED_HEADER = "x-specfleet-mirrored"
"""Marks a request the gateway mirrored (its value: the experiment): never mirrored again, so an
arm pointed back at a mirroring gateway cannot loop."""
SAMPLE_PATH = "/mirror/sample"
"""Where a gateway's metrics port serves the sample of prompts it kept (`Mirror.keep_sample`)."""
SAMPLE_EXPERIMENT_HEADER = "x-specfleet-experiment"
"""Names the experiment whose sample that was."""
ARM_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
MAX_KEPT_SAMPLE = 10_000


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


def shares(by_class: dict[str, float]) -> dict[str, float]:
    """Each class's share of its requests, in (0, 1]."""
    outside = [name for name, share in by_class.items() if not 0 < share <= 1]
    if outside:
        raise ValueError(f"shares must be in (0, 1]: {', '.join(outside)}")
    return by_class


class MirrorArm(ApiModel):
    name: str = Field(max_length=63, pattern=ARM_NAME, description="The arm, as metrics name it.")
    url: str = Field(
        max_length=253,
        description="Base URL of the arm's own gateway Service: `http://` and a loopback "
        "address or a Service name (`<service>.<namespace>.svc[.cluster.local]`), a port, "
        "no path.",
    )

    _url = field_validator("url")(lambda url: cluster_url(url))


def cluster_url(url: str) -> str:
    """A Service's base URL (or a loopback one), the only targets a gateway sends requests to
    besides its own engine."""
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.username or parts.password:
        raise ValueError("must be http://HOST[:PORT], without credentials")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError("must have no path, query or fragment")
    if not _cluster_host(parts.hostname or ""):
        raise ValueError(
            "host must be loopback or a Service name (<service>.<namespace>.svc, "
            "optionally .cluster.local)"
        )
    return url.rstrip("/")


def _cluster_host(host: str) -> bool:
    """Loopback, or a Service's DNS name. No other address: one could be the cloud's metadata
    endpoint or a host outside the cluster. The cluster's DNS resolves `<service>.<namespace>.svc`
    whatever its domain, so another domain need not be allowed."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    labels = host.lower().split(".")
    service = len(labels) in (3, 5) and labels[2:] in (["svc"], ["svc", "cluster", "local"])
    return host == "localhost" or (service and all(labels[:2]))


class Mirror(ApiModel):
    """Mirroring a sample of the traffic to an experiment's arms (issue 18). The gateway
    connects only to the arms named here: nothing in a client's request chooses a target."""

    experiment: str = Field(min_length=1, max_length=253, description="For logs.")
    arms: list[MirrorArm] = Field(min_length=1, max_length=8)
    baseline: str = Field(description="The arm whose greedy outputs the others are compared to.")
    sample: dict[str, float] = Field(
        min_length=1,
        description="Share of each class's requests to mirror, in (0, 1]; a class not listed "
        "is not mirrored.",
    )
    queue_bound: int = Field(
        default=256, ge=1, le=100_000, description="Requests waiting; then new ones are dropped."
    )
    concurrency: int = Field(
        default=16, ge=1, le=1024, description="Requests in flight to the arms at once."
    )
    timeout_seconds: float = Field(
        default=120.0, gt=0, le=3600, description="Longest an arm may take to answer."
    )
    max_request_bytes: int = Field(
        default=256 * 1024, ge=1, description="Larger requests are not mirrored (counted)."
    )
    keep_sample: int | None = Field(
        default=None,
        ge=1,
        le=MAX_KEPT_SAMPLE,
        description="Keep up to this many of each class's mirrored requests (a uniform sample, "
        "in memory) for the experiment's capacity phase, served at `GET /mirror/sample` on the "
        "metrics port; none when absent.",
    )
    sample_token: str | None = Field(
        default=None,
        min_length=16,
        description="The bearer token `GET /mirror/sample` requires: the sample holds live "
        "prompts. Required with `keepSample`.",
    )

    _sample = field_validator("sample")(lambda sample: shares(sample))

    @model_validator(mode="after")
    def _arms(self) -> Self:
        names = [arm.name for arm in self.arms]
        if len(set(names)) != len(names):
            raise ValueError("arm names must be unique")
        if self.baseline not in names:
            raise ValueError(f"baseline {self.baseline!r} is not one of the arms {names}")
        if self.keep_sample is not None and self.sample_token is None:
            raise ValueError("keepSample needs sampleToken: the kept prompts are served to it only")
        return self


class PlainRoute(ApiModel):
    """The classes served without speculation, and the plain pool's Service that serves them."""

    url: str = Field(
        max_length=253,
        description="Base URL of the plain pool's Service: `http://` and a loopback address or "
        "a Service name, a port, no path. Unreachable, the gateway serves locally.",
    )
    classes: list[str] = Field(min_length=1, description="The classes routed there.")
    trial: dict[str, float] = Field(
        default_factory=dict,
        # Absent when empty: a gateway from before trials still reads the configuration.
        exclude_if=lambda trial: not trial,
        description="The share (0 < share <= 1) of a routed class's requests served by the "
        "speculative fleet (the local engine) instead of the plain pool, while the guard judges "
        "on trial whether speculation pays for that class again.",
    )

    _url = field_validator("url")(lambda url: cluster_url(url))
    _trial = field_validator("trial")(lambda trial: shares(trial))

    @model_validator(mode="after")
    def _trial_routed(self) -> Self:
        unrouted = sorted(set(self.trial) - set(self.classes))
        if unrouted:
            raise ValueError(
                f"trial names classes not routed to the plain pool: {unrouted}; add them to "
                "classes or drop them from trial"
            )
        return self


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
    mirror: Mirror | None = Field(
        default=None, description="An experiment's arms to mirror a sample of requests to."
    )
    plain_pool: PlainRoute | None = Field(
        default=None, description="Classes served by the plain pool instead of the local engine."
    )

    @model_validator(mode="after")
    def _known_classes(self) -> Self:
        known = {c.name for c in self.classes}
        for field, named in (
            ("mirror.sample", self.mirror.sample if self.mirror else {}),
            ("plainPool.classes", self.plain_pool.classes if self.plain_pool else []),
        ):
            unknown = sorted(set(named) - known)
            if unknown:
                raise ValueError(f"{field} names classes that do not exist: {unknown}")
        return self

    def routed(self) -> frozenset[str]:
        """The classes the plain pool serves."""
        return frozenset(self.plain_pool.classes) if self.plain_pool else frozenset()

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
