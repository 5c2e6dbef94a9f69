"""What a verdict stands on, for its report: where each arm's throughput at SLO came from (a
model, a load test or the sample at concurrency one), what the price is and in which currency,
and the SLOs the arms were held to. The verdict itself records none of it: `simulate` writes it
beside the verdict (`basis.json`); a SpecExperiment's spec and status tell it for a live one."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from specfleet.api.spec import ClassSlo
from specfleet.api.verdict import ArmName
from specfleet.yamlio import InputError

BASIS = "basis.json"


class Source(StrEnum):
    MODEL = "model"
    LOAD_TEST = "load test"
    CONCURRENCY_ONE = "concurrency one"
    UNKNOWN = "unknown"


SOURCE_WORDS = {
    Source.MODEL: "computed by the simulated fleet's model (`simulate.physics`): the highest load "
    "at which every class's p95 TTFT and TPOT stay inside their SLOs; not measured",
    Source.LOAD_TEST: "measured by a load test of the arm (guidellm at rising concurrency, "
    "`spec.capacity`): the highest step at which every class's p95s stay inside their SLOs",
    Source.CONCURRENCY_ONE: "measured on the sample at concurrency one (1 / the mean request "
    "time): no load test; it flatters speculation, whose gain is largest at low concurrency",
    Source.UNKNOWN: "not recorded: a bare verdict file says nothing of it (`simulate` writes "
    f"`{BASIS}` beside its verdict)",
}
INTERVAL_WORDS = {
    Source.MODEL: "the model's throughput is one computed value, with no sampling error to bound",
    Source.LOAD_TEST: "one load test per arm gives one throughput, with no repeat to bound it by",
    Source.CONCURRENCY_ONE: "the mean request time's own uncertainty is not propagated",
    Source.UNKNOWN: "the throughput's uncertainty is not known",
}


class ArmThroughput(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    source: Source
    detail: str = Field(default="", description="e.g. the load test's step, or why it failed")


class Basis(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    throughput: dict[ArmName, ArmThroughput]
    price_source: str = Field(description="Where the GPU-hour price was set.")
    currency: str | None = Field(default=None, description="None: the price names none.")
    slos: dict[str, ClassSlo] = Field(
        default_factory=dict, description="Each class's SLO; empty when not known."
    )

    def sources(self) -> set[Source]:
        return {t.source for t in self.throughput.values()}

    def money(self) -> str:
        """The unit of a price or cost."""
        return self.currency or "price units"


def unknown() -> Basis:
    return Basis(
        throughput={arm: ArmThroughput(source=Source.UNKNOWN) for arm in ArmName},
        price_source="not recorded",
    )


def load_basis(path: Path) -> Basis:
    try:
        return Basis.model_validate_json(path.read_text())
    except (OSError, ValidationError) as exc:
        raise InputError(str(path), [str(exc)]) from None


def basis_json(basis: Basis) -> str:
    return basis.model_dump_json(indent=2, exclude_defaults=True) + "\n"


def of_specexperiment(
    data: dict[str, Any], slos: dict[str, ClassSlo] | None = None, currency: str | None = None
) -> Basis:
    """A SpecExperiment's basis: each arm's capacity result if its load test gave one, else its
    throughput at concurrency one on the sample; the price from its spec."""
    status = data.get("status") or {}
    tested = {arm.get("name"): arm for arm in (status.get("capacity") or {}).get("arms") or []}
    throughput = {}
    for arm in ArmName:
        result = tested.get(str(arm)) or {}
        if result.get("throughputAtSlo") is not None:
            step = result.get("concurrency")
            detail = f"at concurrency {step}" if step is not None else ""
            throughput[arm] = ArmThroughput(source=Source.LOAD_TEST, detail=detail)
        else:
            failed = result.get("failed")
            detail = f"its load test failed: {failed}" if failed else ""
            throughput[arm] = ArmThroughput(source=Source.CONCURRENCY_ONE, detail=detail)
    name = (data.get("metadata") or {}).get("name", "?")
    return Basis(
        throughput=throughput,
        price_source=f"SpecExperiment {name}, spec.gpuHourPrice",
        currency=currency,
        slos=slos or {},
    )
